#!/usr/bin/env bash
# Round 34, device call E1 (carries .dev_stage/a, copied to /root for r34_call_e2.sh right after): the GPU contract
# test of where a step puts a pass (tests/gpu/test_pass_order_cuda.py: pass_before_read, split_pass_steps, both,
# against the default's bits with passes held back on their stream; a free run as the negative control).
#
#   bash benchmarks/device/r34_call_e1.sh
source "$(dirname "$0")/session_preamble.sh"
export LLM42_GPU_REPORT="$OUT/gpu_report_e1.jsonl" LLM42_FAIL_LOG="$OUT/failures.txt"
timeout "${CAP:-90}" python3 -m pytest -v -m gpu tests/gpu/test_pass_order_cuda.py -p no:cacheprovider -rfE \
    --durations=5 >"$OUT/gpu_tests_e1.txt" 2>&1
log "gpu tests exit $?"; grep -E "passed|failed|FAILED|ERROR|pass_order" "$OUT/gpu_tests_e1.txt" | tail -n 12
log "done"
