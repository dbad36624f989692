#!/usr/bin/env bash
# Device call C (no carry; after r54_call_b.sh). Round 54's listed filter on the 8B shape: 10 of the 1,000 requests
# ask for top_p = 0.9 (dvr_ab.py --top-p-requests), nondet, admission by budget: the default (a step with at most 64
# filtered rows sorts those rows only) against every row of such a step filtered (admit_budget_unlisted, as before
# round 54), TOP_P_REPEATS times (ABBA); no warm-up runs (each build captures every graph).
#
#   [TOP_P_REPEATS=1] bash benchmarks/device/r54_call_c.sh
source "$(dirname "$0")/session_preamble.sh"
ARGS="--model 8b --lm-head-std 0.2 --lm-head-bias-scale 26.9 --max-num-seqs 1024 --warmup-requests 0"
# shellcheck disable=SC2086  # ARGS is a list of options
timeout "${TOP_P_CAP:-400}" python3 benchmarks/device/dvr_ab.py $ARGS --variants admit_budget,admit_budget_unlisted \
    --modes nondet --repeats "${TOP_P_REPEATS:-1}" --budget-s 160 --top-p-requests 10 \
    --out "$OUT/dvr_ab_8b_top_p.json" >"$OUT/dvr_ab_8b_top_p.txt" 2>&1
log "8b top-p exit $?"; grep -E "tok/s|median|note" "$OUT/dvr_ab_8b_top_p.txt" | cut -c1-200 | tail -n 12
log "done"
