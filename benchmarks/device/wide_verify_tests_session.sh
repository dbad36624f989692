#!/usr/bin/env bash
# One device call (issue 10, round 8): the GPU tests of drafting ahead and wide verify passes (8 layers):
# tests/gpu/test_wide_pass_cuda.py (wide prompt and verify passes commit R-row passes' bits),
# tests/gpu/test_engine_cuda.py (needles; their batches draft ahead), test_mixed_cuda.py,
# test_canonical_stream_cuda.py, test_rl_cuda.py (score() through the canonical pass).
# Carry .dev_stage/a: its half of the SmolLM2 stage is copied to /root for the next call (dvr_ab_session.sh).
#
#   bash benchmarks/device/wide_verify_tests_session.sh       (OUT=... as the device tool sets it)
source "$(dirname "$0")/session_preamble.sh"
LLM42_GPU_TEST_LAYERS=8 timeout 300 python3 -m pytest -v -p no:cacheprovider -m gpu --durations=8 \
    tests/gpu/test_wide_pass_cuda.py tests/gpu/test_engine_cuda.py tests/gpu/test_mixed_cuda.py \
    tests/gpu/test_canonical_stream_cuda.py tests/gpu/test_rl_cuda.py >"$OUT/gpu_tests_wide_verify.txt" 2>&1
log "gpu tests exit $?"
tail -n 16 "$OUT/gpu_tests_wide_verify.txt" >>"$LOG"
log "done"
