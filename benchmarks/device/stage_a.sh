#!/usr/bin/env bash
# A device call that stages (carry .dev_stage/a): session_preamble.sh copies the first half of the SmolLM2 GGUF to
# /root, where a call right after it (carrying .dev_stage/b, e.g. r37_call_b.sh) joins it; what the GPU is, for the
# log. RUN_TESTS=1: first the GPU test of step(deliver=...) (tests/gpu/test_step_deliver_cuda.py, TEST_CAP seconds).
#
#   [RUN_TESTS=1] bash benchmarks/device/stage_a.sh
source "$(dirname "$0")/session_preamble.sh"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv | tee -a "$LOG"
if [ "${RUN_TESTS:-0}" = 1 ]; then
    export LLM42_GPU_REPORT="$OUT/gpu_report_a.jsonl" LLM42_FAIL_LOG="$OUT/failures.txt"
    timeout "${TEST_CAP:-150}" python3 -m pytest -v -m gpu tests/gpu/test_step_deliver_cuda.py -p no:cacheprovider \
        -rfE --durations=5 >"$OUT/gpu_tests_a.txt" 2>&1
    log "gpu tests exit $?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu_tests_a.txt" | tail -n 12
fi
log "staged"
