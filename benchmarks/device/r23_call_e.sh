#!/usr/bin/env bash
# Round 23, device call E: the GPU tests after the CPU-side changes that followed call D (a pass's sampling rows
# staged per run of rows, commits appended in one go, the chained-pass test's held launch shared by its tests):
# chained passes (prompt chunks, verify windows) and the engine's contract tests (needles alone and in batches).
#
#   bash benchmarks/device/r23_call_e.sh
source "$(dirname "$0")/session_preamble.sh"
timeout 170 python3 -m pytest -q -m gpu tests/gpu/test_chained_prefill_cuda.py tests/gpu/test_engine_cuda.py \
    -p no:cacheprovider >"$OUT/gpu_tests_e.txt" 2>&1
log "gpu tests (chained passes, engine) exit $?"; tail -n 3 "$OUT/gpu_tests_e.txt"
log "done"
