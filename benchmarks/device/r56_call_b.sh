#!/usr/bin/env bash
# Round 56's second call (carry .dev_stage/m, at once after r56_call_a.sh carried .dev_stage/a): the 8B shape served
# with TOP_P of 1,000 requests asking for top_p = 0.9 (400: most of the sampled half, so nearly every step filters
# most of its sampled rows; 10: a few rows in every step), nondet, admission by budget: the threshold's search split
# over programs (the default) against one program per row (admit_budget_filter_whole), one run each, no warm-up runs.
#
#   [TOP_P=400] [CAP=330] bash benchmarks/device/r56_call_b.sh
source "$(dirname "$0")/session_preamble.sh"
ARGS="--model 8b --lm-head-std 0.2 --lm-head-bias-scale 26.9 --max-num-seqs 1024 --warmup-requests 0"
# shellcheck disable=SC2086  # ARGS is a list of options
timeout "${CAP:-330}" python3 benchmarks/device/dvr_ab.py $ARGS \
    --variants admit_budget,admit_budget_filter_whole --modes nondet --repeats 1 --budget-s 100 \
    --top-p-requests "${TOP_P:-400}" --out "$OUT/dvr_ab_8b_top_p_${TOP_P:-400}.json" \
    >"$OUT/dvr_ab_8b_top_p_${TOP_P:-400}.txt" 2>&1
log "8b top-p ${TOP_P:-400} exit $?"; grep -E "tok/s|median|note" "$OUT/dvr_ab_8b_top_p_${TOP_P:-400}.txt" \
    | cut -c1-200 | tail -n 8
log "done"
