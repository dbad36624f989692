#!/usr/bin/env bash
# Round 14, device call D (carry .dev_stage/a; copies part_a to /root for call E): the batch-invariant Triton
# matmul with its tiles pinned per weight shape (gemm_config_sweep.py, call C): the GPU tests of its rows (every
# pinned shape, the wide passes under FixedShapePolicy(gemm="triton")), then round 13's call C again (8B shape:
# canonical pass timings and deterministic TTFT at 8,192 / 15,000 tokens, cuBLAS against Triton).
#
#   bash benchmarks/device/r14_call_d.sh [LONG_PROMPTS_BUDGET_S]
source "$(dirname "$0")/session_preamble.sh"
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_batch_invariant.py \
    tests/gpu/test_wide_pass_cuda.py >"$OUT/gpu_tests_r14.txt" 2>&1
log "gpu tests exit $? ($(tail -n 1 "$OUT/gpu_tests_r14.txt"))"
grep -E "FAILED|ERROR" "$OUT/gpu_tests_r14.txt" | head -n 20
OUT="$OUT" bash benchmarks/device/r13_call_c.sh "${1:-80}"
