#!/usr/bin/env bash
# Round 23, device call A2 (carries .dev_stage/a, for call B right after): the chained-pass GPU tests again, the
# verify-window case now admitting its requests at staggered steps (call A's ran them in one batch: their windows
# fell due together and nothing chained, 0 of 12 passes).
#
#   bash benchmarks/device/r23_call_a2.sh
source "$(dirname "$0")/session_preamble.sh"
timeout 150 python3 -m pytest -q -m gpu tests/gpu/test_chained_prefill_cuda.py -p no:cacheprovider \
    >"$OUT/gpu_tests_a2.txt" 2>&1
log "gpu tests (chained passes) exit $?"; tail -n 3 "$OUT/gpu_tests_a2.txt"; grep '"fact"' "$OUT/gpu_tests_a2.txt"
log "done"
