#!/usr/bin/env bash
# Round 30, device call A (carries .dev_stage/a: the first half of the SmolLM2 stage, copied to /root for call B):
# the GPU tests. Round 29 ran the suites of rounds 26-28's changed code (40 passed); this call runs the suites of
# code changed since (first) and then every other GPU test, each within what is left of 420 s (calls B and C need ~570 s each of the session's 1,800).
#
#   bash benchmarks/device/r30_call_a.sh
source "$(dirname "$0")/session_preamble.sh"
export LLM42_GPU_REPORT="$OUT/gpu_report_a.jsonl"
first="tests/gpu/test_engine_cuda.py tests/gpu/test_wide_pass_cuda.py tests/gpu/test_mixed_cuda.py
       tests/gpu/test_chained_prefill_cuda.py tests/gpu/test_prompt_drafts_cuda.py tests/test_batch_invariant.py"
timeout 300 python3 -m pytest -v -m gpu $first -p no:cacheprovider --durations=15 -rfE \
    >"$OUT/gpu_tests_a_first.txt" 2>&1
log "gpu tests (first) exit $?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu_tests_a_first.txt" | tail -n 12
rest=$(ls tests/gpu/test_*.py tests/test_sampling_kernels.py tests/test_flash_backend.py tests/test_plugin.py \
       tests/test_close.py | grep -v -F -e test_engine_cuda -e test_wide_pass -e test_mixed_cuda -e test_chained_prefill -e test_prompt_drafts)
left=$(( ${CAP:-420} - ($(date +%s) - START) ))
[ "$left" -gt 30 ] && timeout "$left" python3 -m pytest -v -m gpu $rest -p no:cacheprovider --durations=10 -rfE \
    >"$OUT/gpu_tests_a_rest.txt" 2>&1
log "gpu tests (the rest, ${left}s) exit $?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu_tests_a_rest.txt" | tail -n 12
log "done"
