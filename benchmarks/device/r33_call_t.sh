#!/usr/bin/env bash
# Round 33, device call T (carries .dev_stage/a: the first half of the SmolLM2 stage, copied to /root for the next
# call, r33_call_c.sh with .dev_stage/b): the GPU suites round 32 did not reach on the H100 (test_plugin, then the
# rest of test_tiled_attention and test_fused), each failure's traceback in $OUT/failures.txt, within ${CAP:-100} s.
#
#   CAP=100 bash benchmarks/device/r33_call_t.sh
source "$(dirname "$0")/session_preamble.sh"
export LLM42_GPU_REPORT="$OUT/gpu_report_t.jsonl" LLM42_FAIL_LOG="$OUT/failures.txt"
nvidia-smi --query-gpu=name,memory.total --format=csv >"$OUT/gpu.txt" 2>&1
timeout "${CAP:-100}" python3 -m pytest -v -m gpu tests/test_plugin.py tests/gpu/test_tiled_attention.py \
    tests/gpu/test_fused.py -p no:cacheprovider --durations=10 -rfE >"$OUT/gpu_tests_t.txt" 2>&1
log "gpu tests exit $?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu_tests_t.txt" | tail -n 12
log "done"
