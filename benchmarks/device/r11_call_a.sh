#!/usr/bin/env bash
# Round 11, device call A (issue 10): copies .dev_stage/a/part_a to /root for call B (when carried); then the
# whole GPU suite (the default fast path changed: deterministic requests' decode rows take the canonical
# attention's bits, FastPolicy(decode_kernel="deterministic")).
#
#   bash benchmarks/device/r11_call_a.sh [TIMEOUT_S]       (OUT=... as the device tool sets it)
source "$(dirname "$0")/session_preamble.sh"
LIMIT=${1:-330}
timeout "$LIMIT" python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu --durations=15 \
    >"$OUT/gpu_tests.txt" 2>&1
log "gpu tests exit $? ($(tail -n 1 "$OUT/gpu_tests.txt"))"
grep -E "FAILED|ERROR" "$OUT/gpu_tests.txt" | head -n 20
log "done"
