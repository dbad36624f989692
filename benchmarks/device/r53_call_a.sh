#!/usr/bin/env bash
# Round 53, device call A (carry .dev_stage/a; stage_a.sh carrying .dev_stage/m and r51_call_e.sh carrying
# .dev_stage/b may follow at once). Round 52's tune_decode_buckets, built and CPU-tested only: first its CUDA test
# (every bucket timed, a forced map replays batches on a larger bucket's graph, the same committed bits), then the
# 8B shape's nondet throughput with and without it under the budget admission (round 50's best, 11.95K), REPEATS
# times in ABBA order in one process. Stages the first third of the SmolLM2 GGUF.
#
#   [REPEATS=3] bash benchmarks/device/r53_call_a.sh
export RUN_TESTS=1 TEST_CAP=${TEST_CAP:-150} GPU_TESTS="tests/gpu/test_decode_buckets_cuda.py"
source "$(dirname "$0")/stage_a.sh"
ARGS="--model 8b --lm-head-std 0.2 --lm-head-bias-scale 26.9 --max-num-seqs 1024 --warmup-requests 4"
# shellcheck disable=SC2086  # ARGS is a list of options
timeout "${DVR_CAP:-330}" python3 benchmarks/device/dvr_ab.py $ARGS --variants admit_budget,admit_budget_tuned_buckets \
    --modes nondet --repeats "${REPEATS:-3}" --budget-s 60 --out "$OUT/dvr_ab_8b_tuned.json" >"$OUT/dvr_ab_8b_tuned.txt" 2>&1
log "8b tuned buckets exit $?"; grep -E "tok/s|median|bucket" "$OUT/dvr_ab_8b_tuned.txt" | cut -c1-220 | tail -n 12
log "done"
