#!/usr/bin/env bash
# Device call B (no carry). The 8B shape's nondet, admission by budget, without warm-up runs
# (each build captures every graph; each run's notes say whether a capture failed, the JSON has its mixed_steps):
# mixed steps (decode rows and prompt chunks in one pass, now that their graphs fit) against two passes
# (admit_budget_no_mixed: what round 53's 8B runs did, and very likely earlier ones), REPEATS times (ABBA);
# (round 55: r55_call_one.sh runs one repeat of the same after its tests.)
#
#   [REPEATS=2] bash benchmarks/device/r54_call_b.sh
source "$(dirname "$0")/session_preamble.sh"
ARGS="--model 8b --lm-head-std 0.2 --lm-head-bias-scale 26.9 --max-num-seqs 1024 --warmup-requests 0"
# shellcheck disable=SC2086  # ARGS is a list of options
timeout "${DVR_CAP:-540}" python3 benchmarks/device/dvr_ab.py $ARGS --variants admit_budget,admit_budget_no_mixed \
    --modes nondet --repeats "${REPEATS:-2}" --budget-s 140 --out "$OUT/dvr_ab_8b_mixed.json" \
    >"$OUT/dvr_ab_8b_mixed.txt" 2>&1
log "8b mixed exit $?"; grep -E "tok/s|median|note" "$OUT/dvr_ab_8b_mixed.txt" | cut -c1-200 | tail -n 12
log "done"
