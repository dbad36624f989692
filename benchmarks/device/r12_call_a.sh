#!/usr/bin/env bash
# Round 12, device call A (carry .dev_stage/a): copies part_a to /root for call B; then the GPU tests of the
# chunked canonical attention (decode = packed = verify window, the policy's routing, the contract under it) and
# the engine's CUDA tests (its scheduler's prompt share included).
#
#   bash benchmarks/device/r12_call_a.sh [TIMEOUT_S]
source "$(dirname "$0")/session_preamble.sh"
LIMIT=${1:-240}
timeout "$LIMIT" python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_tiled_attention.py \
    tests/gpu/test_engine_cuda.py -k "chunked or routes or decode_kernel or engine" \
    >"$OUT/gpu_tests_r12.txt" 2>&1
log "gpu tests exit $? ($(tail -n 1 "$OUT/gpu_tests_r12.txt"))"
grep -E "FAILED|ERROR" "$OUT/gpu_tests_r12.txt" | head -n 20
log "done"
