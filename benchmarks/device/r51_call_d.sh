#!/usr/bin/env bash
# Round 51, device call D (no carry): the lean Gumbel sweep as the default (kernels.sampling: greedy rows skipped,
# ~1,024 programs). First the GPU tests that run the engine's sampler on CUDA (sampler kernels, engine contract, pass
# order), then the 8B shape's nondet and dvr@10 under the default admission, the configuration that met issue 10's
# 0.90 in round 45 (0.936), one run.
#
#   bash benchmarks/device/r51_call_d.sh
export RUN_TESTS=1 TEST_CAP=${TEST_CAP:-150}
export GPU_TESTS="tests/test_sampling_kernels.py tests/gpu/test_engine_cuda.py tests/gpu/test_pass_order_cuda.py"
source "$(dirname "$0")/stage_a.sh"
ARGS="--model 8b --lm-head-std 0.2 --lm-head-bias-scale 26.9 --max-num-seqs 1024 --warmup-requests 4"
# shellcheck disable=SC2086  # ARGS is a list of options
timeout "${DVR_CAP:-220}" python3 benchmarks/device/dvr_ab.py $ARGS --variants default --modes nondet,dvr@10 \
    --budget-s 100 --out "$OUT/dvr_ab_8b_dvr10.json" >"$OUT/dvr_ab_8b_dvr10.txt" 2>&1
log "8b dvr@10 exit $?"; grep -E "tok/s" "$OUT/dvr_ab_8b_dvr10.txt" | cut -c1-200 | tail -n 3
log "done"
