#!/usr/bin/env bash
# Round 24, device call A (carries .dev_stage/a): the GPU tests touched by draft margins: the sampling kernels'
# runner-up (tests/test_sampling_kernels.py on CUDA), windows closed at risky drafts on CUDA
# (tests/gpu/test_risk_margin_cuda.py), and the engine / chained-pass / canonical-stream contract tests with the
# decode graphs now carrying margins.
#
#   bash benchmarks/device/r24_call_a.sh
source "$(dirname "$0")/session_preamble.sh"
export LLM42_GPU_REPORT="$OUT/gpu_report.jsonl"
timeout 330 python3 -m pytest -q -m gpu tests/test_sampling_kernels.py tests/gpu/test_risk_margin_cuda.py \
    tests/gpu/test_engine_cuda.py tests/gpu/test_chained_prefill_cuda.py tests/gpu/test_canonical_stream_cuda.py \
    -p no:cacheprovider >"$OUT/gpu_tests_a.txt" 2>&1
log "gpu tests exit $?"; tail -n 5 "$OUT/gpu_tests_a.txt"
cat "$LLM42_GPU_REPORT" 2>/dev/null | grep risk
log "done"
