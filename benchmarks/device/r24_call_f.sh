#!/usr/bin/env bash
# Round 24, device call F (carries .dev_stage/b, right after call E): windows closed at risky drafts that ride the
# next pass formed for other work instead of forming one (DefaultScheduler(risky_windows="ride")), at 0.125 and
# 0.25 logits, beside the default engine in the middle; real SmolLM2, 1,000 chat requests offline (nondet / dvr@10
# / dvr@50) and online at 0.7 x capacity (nondet / dvr@50, 400 requests). Shorter budgets than calls B and D (the
# session's device time).
#
#   bash benchmarks/device/r24_call_f.sh
source "$(dirname "$0")/session_preamble.sh"
source "$(dirname "$0")/smollm2_env.sh"
timeout 450 python3 benchmarks/device/dvr_ab.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --variants ride_0.125,default,ride_0.25 --budget-s 120 --warmup-requests 16 --warmup-modes dvr@50 \
    --online-load 0.7 --online-modes nondet,dvr@50 --online-requests 400 --online-budget-s 80 \
    --out "$OUT/dvr_ab_smollm2_r24_f.json" >"$OUT/dvr_ab_smollm2.txt" 2>&1
log "dvr_ab smollm2 exit $?"
grep -E "^\[dvr_ab\]|rror" "$OUT/dvr_ab_smollm2.txt" | grep -v warm-up | tail -n 30
log "done"
