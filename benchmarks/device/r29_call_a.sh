#!/usr/bin/env bash
# Round 29, device call A (carries .dev_stage/a: the first half of the SmolLM2 stage, copied to /root for call B):
# the GPU tests, none run since round 25 (rounds 26-28 changed the canonical pass's staging, now NumPy; the GEMM at a
# fixed M; the canonical stream's priority; the wide passes): the suites whose code changed first, then the rest,
# each file's result in the log even if the call is cut.
#
#   bash benchmarks/device/r29_call_a.sh
source "$(dirname "$0")/session_preamble.sh"
export LLM42_GPU_REPORT="$OUT/gpu_report_a.jsonl"
first="tests/gpu/test_engine_cuda.py tests/gpu/test_wide_pass_cuda.py tests/gpu/test_gemm_rows_cuda.py
       tests/gpu/test_mixed_cuda.py tests/gpu/test_chained_prefill_cuda.py tests/gpu/test_canonical_stream_cuda.py
       tests/gpu/test_canonical_sms_cuda.py tests/test_batch_invariant.py"
timeout 280 python3 -m pytest -v -m gpu $first -p no:cacheprovider --durations=15 -rfE \
    >"$OUT/gpu_tests_a_changed.txt" 2>&1
log "gpu tests (changed code) exit $?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu_tests_a_changed.txt" | tail -n 12
# the other GPU tests (unchanged code) when RUN_REST=1 and the lease allows
if [ "${RUN_REST:-0}" = 1 ]; then
rest=$(ls tests/gpu/test_*.py tests/test_sampling_kernels.py tests/test_flash_backend.py tests/test_plugin.py \
       tests/test_close.py | grep -v -F -e test_engine_cuda -e test_wide_pass -e test_gemm_rows -e test_mixed_cuda \
       -e test_chained_prefill -e test_canonical_stream -e test_canonical_sms)
timeout 200 python3 -m pytest -v -m gpu $rest -p no:cacheprovider --durations=10 -rfE \
    >"$OUT/gpu_tests_a_rest.txt" 2>&1
log "gpu tests (the rest) exit $?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu_tests_a_rest.txt" | tail -n 12
fi
log "done"
