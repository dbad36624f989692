#!/usr/bin/env bash
# Round 13, device call A (carry .dev_stage/a): copies part_a to /root for call B; the GPU tests of wide passes
# (cuBLAS R-row blocks, and the canonical GEMM as the batch-invariant Triton matmul: rows their own at any M, wide
# passes' bits = R-row passes', the Triton config's K/V differs from cuBLAS's); then what a canonical pass costs
# on SmolLM2's shape with each canonical GEMM (profile_passes.py, CUDA events), and its kernels by class.
#
#   bash benchmarks/device/r13_call_a.sh [TESTS_TIMEOUT_S] [TIMINGS]   (0 skips the tests; TIMINGS 0 skips the timings)
source "$(dirname "$0")/session_preamble.sh"
LIMIT=${1:-240}
TIMINGS=${2:-1}
if [ "$LIMIT" -gt 0 ]; then
    timeout "$LIMIT" python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_wide_pass_cuda.py \
        >"$OUT/gpu_tests_r13.txt" 2>&1
    log "gpu tests exit $? ($(tail -n 1 "$OUT/gpu_tests_r13.txt"))"
    grep -E "FAILED|ERROR|fact" "$OUT/gpu_tests_r13.txt" | head -n 20
fi
for gemm in $([ "$TIMINGS" -gt 0 ] && echo cublas triton); do
    timeout 120 python3 benchmarks/device/profile_passes.py --model smollm2 --canonical-gemm "$gemm" \
        --out "$OUT/passes_smollm2_$gemm.json" >>"$LOG" 2>&1
    log "profile_passes smollm2 $gemm exit $?"
done
grep -E "^(verify|chunk|decode)" "$LOG" | tail -n 26
for gemm in cublas triton; do  # kernel time by class, eager passes under torch.profiler
    timeout 120 python3 benchmarks/device/profile_passes.py --model smollm2 --canonical-gemm "$gemm" --kernel-profile \
        --out "$OUT/passes_kernels_smollm2_$gemm.json" 2>&1 | grep -v "^USDT\|^STAGE" | tee -a "$LOG" | tail -n 4
    log "kernel profile smollm2 $gemm exit $?"
done
log "done"
