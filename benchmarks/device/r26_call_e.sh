#!/usr/bin/env bash
# Round 26, device call E (no carry; optional, after A-D if device time is left): the 8B shape with the calibrated
# head at dvr@10, whose ratio its last deterministic request sets (request 717: 1,177-token prompt, 1,024 outputs,
# 15-18 rollbacks in rounds 21-25): the default engine against windows closed at a risky draft that ride the next pass
# (risk_margin 0.125, round 24: a rollback then throws away the drafts since the flip only) and against every pass
# first with the budget order (canonical_priority="prompts", order="budget").
#
#   bash benchmarks/device/r26_call_e.sh
source "$(dirname "$0")/session_preamble.sh"
timeout 560 python3 benchmarks/device/dvr_ab.py --model 8b --variants default,ride_0.125,order_budget_prompts \
    --modes nondet,dvr@10 --lm-head-std 0.2 --lm-head-bias-scale 26.9 --max-num-seqs 1024 --budget-s 300 \
    --warmup-requests 8 --warmup-modes dvr@10 --out "$OUT/dvr_ab_8b_r26_e.json" >"$OUT/dvr_ab_8b_e.txt" 2>&1
log "dvr_ab 8b exit $?"
grep -E "^\[dvr_ab\]|rror" "$OUT/dvr_ab_8b_e.txt" | tail -n 14
log "done"
