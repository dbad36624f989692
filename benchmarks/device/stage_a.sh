#!/usr/bin/env bash
# A device call that stages (carry .dev_stage/a, or .dev_stage/m right after): session_preamble.sh copies the first or
# middle third of the SmolLM2 GGUF to /root, where a call right after both (carrying .dev_stage/b, e.g. r51_call_b.sh)
# joins them; what the GPU is, for the log. RUN_TESTS=1: first the GPU tests GPU_TESTS (test files or node ids;
# default round 38's, $ABR_TEST: apply_before_read on CUDA; round 37's was tests/gpu/test_step_deliver_cuda.py),
# TEST_CAP seconds.
#
#   [RUN_TESTS=1 [GPU_TESTS="tests/gpu/a.py tests/gpu/b.py"]] bash benchmarks/device/stage_a.sh
source "$(dirname "$0")/session_preamble.sh"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv | tee -a "$LOG"
if [ "${RUN_TESTS:-0}" = 1 ]; then
    export LLM42_GPU_REPORT="$OUT/gpu_report_a.jsonl" LLM42_FAIL_LOG="$OUT/failures.txt"
    ABR_TEST=tests/gpu/test_pass_order_cuda.py::test_apply_before_read_commits_the_default_bits
    # shellcheck disable=SC2086  # a list of test files
    timeout "${TEST_CAP:-150}" python3 -m pytest -v -m gpu ${GPU_TESTS:-$ABR_TEST} -p no:cacheprovider \
        -rfE --durations=5 >"$OUT/gpu_tests_a.txt" 2>&1
    log "gpu tests exit $?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu_tests_a.txt" | tail -n 12
fi
log "staged"
