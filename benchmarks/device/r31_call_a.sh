#!/usr/bin/env bash
# Round 31, device call A (carries .dev_stage/a: the first half of the SmolLM2 stage, copied to /root for call B).
# Round 31's first call (r30_call_a.sh) came on an H100 (80 GB): one negative control that did not bite there
# (cuBLAS's 256-row blocks gave the Triton GEMM's bits; the control is now another attention key block) and a
# cascade of out-of-memory failures (a failed test's frames, kept by pytest in sys.last_*, held its generators;
# tests/conftest.py now frees them after every GPU test). This call runs the tests that failed there, then those the
# 360 s cap did not reach, each failure's traceback written to $OUT/failures.txt as it happens.
#
#   bash benchmarks/device/r31_call_a.sh
source "$(dirname "$0")/session_preamble.sh"
export LLM42_GPU_REPORT="$OUT/gpu_report_a.jsonl" LLM42_FAIL_LOG="$OUT/failures.txt"
nvidia-smi --query-gpu=name,memory.total --format=csv >"$OUT/gpu.txt" 2>&1
failed="tests/gpu/test_wide_pass_cuda.py::test_wide_passes_with_the_triton_gemm_commit_the_bits_of_r_row_passes_on_cuda
        tests/gpu/test_chained_prefill_cuda.py tests/gpu/test_prompt_drafts_cuda.py
        tests/gpu/test_canonical_stream_cuda.py tests/gpu/test_doctor_cuda.py tests/gpu/test_gemm_rows_cuda.py
        tests/gpu/test_risk_margin_cuda.py tests/gpu/test_rl_cuda.py"
unreached="tests/test_sampling_kernels.py tests/test_flash_backend.py tests/test_plugin.py tests/test_close.py"
# the two long parametrized files last
unreached="$unreached tests/gpu/test_fused.py tests/gpu/test_tiled_attention.py"
timeout "${CAP:-400}" python3 -m pytest -v -m gpu $failed $unreached -p no:cacheprovider --durations=15 -rfE \
    >"$OUT/gpu_tests_a.txt" 2>&1
log "gpu tests exit $?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu_tests_a.txt" | tail -n 20
log "done"
