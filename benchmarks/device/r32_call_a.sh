#!/usr/bin/env bash
# Round 32, device call A (carries .dev_stage/a: the first half of the SmolLM2 stage, copied to /root for call B):
# the GPU tests, on whichever card comes (an H100 in round 31), each failure's traceback written to
# $OUT/failures.txt as it happens. First the suite of code changed in round 31 (test_gemm_rows_cuda: a narrow
# bucket beside a wide one), then the suites round 31's calls did not reach on the H100, then the rest (which
# passed there), each within what is left of ${CAP:-400} s.
#
#   bash benchmarks/device/r32_call_a.sh
source "$(dirname "$0")/session_preamble.sh"
export LLM42_GPU_REPORT="$OUT/gpu_report_a.jsonl" LLM42_FAIL_LOG="$OUT/failures.txt"
nvidia-smi --query-gpu=name,memory.total --format=csv >"$OUT/gpu.txt" 2>&1
cap=${CAP:-400}
first="tests/gpu/test_gemm_rows_cuda.py tests/gpu/test_risk_margin_cuda.py tests/gpu/test_rl_cuda.py
       tests/test_sampling_kernels.py tests/test_flash_backend.py tests/test_plugin.py tests/test_close.py
       tests/gpu/test_fused.py tests/gpu/test_tiled_attention.py"
timeout "$cap" python3 -m pytest -v -m gpu $first -p no:cacheprovider --durations=15 -rfE \
    >"$OUT/gpu_tests_a_first.txt" 2>&1
log "gpu tests (first) exit $?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu_tests_a_first.txt" | tail -n 12
rest=$(ls tests/gpu/test_*.py tests/test_batch_invariant.py | grep -v -F -e test_gemm_rows_cuda -e test_risk_margin \
       -e test_rl_cuda -e test_fused -e test_tiled_attention)
left=$(( cap - ($(date +%s) - START) ))
[ "$left" -gt 30 ] && timeout "$left" python3 -m pytest -v -m gpu $rest -p no:cacheprovider --durations=10 -rfE \
    >"$OUT/gpu_tests_a_rest.txt" 2>&1
log "gpu tests (the rest, ${left}s) exit $?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu_tests_a_rest.txt" | tail -n 12
log "done"
