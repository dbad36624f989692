#!/usr/bin/env bash
# Round 11, device call D (issue 10): copies .dev_stage/a/part_a to /root for call E (when carried); then the GPU
# tests of the fast path's deterministic rows (their attention on a stream of their own beside the split
# kernel): the kernels' and the policy's bits, the contract with each decode kernel, graph replay, mixed steps.
#
#   bash benchmarks/device/r11_call_d.sh [TIMEOUT_S]
source "$(dirname "$0")/session_preamble.sh"
LIMIT=${1:-200}
timeout "$LIMIT" python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_tiled_attention.py \
    -k "deterministic or routes or decode_kernel or decode_launch" >"$OUT/gpu_tests_det_rows.txt" 2>&1
log "kernel tests exit $? ($(tail -n 1 "$OUT/gpu_tests_det_rows.txt"))"
timeout "$LIMIT" python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_mixed_cuda.py \
    tests/gpu/test_engine_cuda.py --durations=10 >>"$OUT/gpu_tests_det_rows.txt" 2>&1
log "gpu tests exit $? ($(tail -n 1 "$OUT/gpu_tests_det_rows.txt"))"
grep -E "FAILED|ERROR|passed|failed" "$OUT/gpu_tests_det_rows.txt" | head -n 20
log "done"
