#!/usr/bin/env bash
# Round 9, device call C (issue 10): the GPU contract tests with the CUDA defaults of round 9 (each canonical pass
# on its own stream, wide verify passes, drafting ahead).
#
#   bash benchmarks/device/r9_call_c.sh       (OUT=... as the device tool sets it)
source "$(dirname "$0")/session_preamble.sh"
timeout 500 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_canonical_stream_cuda.py \
    tests/gpu/test_engine_cuda.py tests/gpu/test_wide_pass_cuda.py tests/gpu/test_mixed_cuda.py \
    >"$OUT/gpu_tests_round9_defaults.txt" 2>&1
log "gpu tests exit $? ($(tail -n 1 "$OUT/gpu_tests_round9_defaults.txt"))"
log "done"
