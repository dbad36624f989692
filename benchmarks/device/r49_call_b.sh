#!/usr/bin/env bash
# Round 49, device call B (carry .dev_stage/b, at once after r49_call_a.sh carried .dev_stage/a): the GPU tests of
# the overlapped decode (bits eager and replayed, the engine's contract with it) and of round 48's decode order,
# then the real SmolLM2 (the default model) offline, 1,000 requests, nondet / dvr@10 / dvr@50, the overlapped
# decode against the tree's step, in one process (r38_call_b.sh, offline only).
#
#   bash benchmarks/device/r49_call_b.sh
source "$(dirname "$0")/session_preamble.sh"
export LLM42_GPU_REPORT="$OUT/gpu_report_b.jsonl" LLM42_FAIL_LOG="$OUT/failures.txt"
timeout "${TEST_CAP:-200}" python3 -m pytest -v -m gpu tests/gpu/test_decode_overlap_cuda.py \
    tests/gpu/test_tiled_attention.py::test_decode_program_order_keeps_the_bits -p no:cacheprovider -rfE \
    --durations=5 >"$OUT/gpu_tests_b.txt" 2>&1
log "gpu tests exit $?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu_tests_b.txt" | tail -n 12
export VARIANTS=${VARIANTS:-overlap,default} MODES=${MODES:-nondet,dvr@10,dvr@50} ONLINE_LOAD=${ONLINE_LOAD-}
export ROUND=r49 TAG=${TAG:-b} CAP=${CAP:-300} BUDGET=${BUDGET:-120}
source "$(dirname "$0")/r38_call_b.sh"
