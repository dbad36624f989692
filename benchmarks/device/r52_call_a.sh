#!/usr/bin/env bash
# Round 52, device call A (carry .dev_stage/a; calls stage_a.sh carrying .dev_stage/m and r51_call_e.sh carrying
# .dev_stage/b follow at once). First the GPU tests with the lean Gumbel sweep as the default (sampler kernels,
# engine contract, pass order: r51_call_d.sh's), then cuBLAS's time for the 8B shape's linears on a fine grid of M
# around the decode batches of round 47's profile (256-354 rows, GEMMs at 543-595 TFLOP/s): whether a batch pays
# for M rounded up to a tile; then the 8B shape's nondet and dvr@10 under the default admission (r51_call_d.sh's
# second half), one run. Stages the first third of the SmolLM2 GGUF.
#
#   bash benchmarks/device/r52_call_a.sh
export RUN_TESTS=1 TEST_CAP=${TEST_CAP:-170}
export GPU_TESTS="tests/test_sampling_kernels.py tests/gpu/test_engine_cuda.py tests/gpu/test_pass_order_cuda.py"
source "$(dirname "$0")/stage_a.sh"
ROWS=192,224,240,256,264,272,288,304,320,336,352,368,384,400,416,448,480,512
timeout "${GEMM_CAP:-120}" python3 benchmarks/device/fast_gemm_ab.py --cublas-only --models 8b --rows "$ROWS" \
    --reps 20 --out "$OUT/gemm_rows_8b.json" >"$OUT/gemm_rows_8b.txt" 2>&1
log "gemm rows exit $?"; grep -cE "TF/s" "$OUT/gemm_rows_8b.txt"
ARGS="--model 8b --lm-head-std 0.2 --lm-head-bias-scale 26.9 --max-num-seqs 1024 --warmup-requests 4"
# shellcheck disable=SC2086  # ARGS is a list of options
timeout "${DVR_CAP:-220}" python3 benchmarks/device/dvr_ab.py $ARGS --variants default --modes nondet,dvr@10 \
    --budget-s 100 --out "$OUT/dvr_ab_8b_dvr10.json" >"$OUT/dvr_ab_8b_dvr10.txt" 2>&1
log "8b dvr@10 exit $?"; grep -E "tok/s" "$OUT/dvr_ab_8b_dvr10.txt" | cut -c1-200 | tail -n 3
log "done"
