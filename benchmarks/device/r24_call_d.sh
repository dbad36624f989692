#!/usr/bin/env bash
# Round 24, device call D (carries .dev_stage/b, right after call C): call B's comparison with call B's margin
# histogram's pick, 0.125 logits (82 % of call B's rejected drafts under it, 4 % of its drafts), drafting ahead past
# risky drafts, in another order: the cut first, then the default, then the cut with every plan chained
# (chain_passes="all": a pass may start while one runs). Real SmolLM2, 1,000 chat requests offline (nondet / dvr@10
# / dvr@50) and online at 0.7 x capacity (nondet / dvr@50).
#
#   bash benchmarks/device/r24_call_d.sh
source "$(dirname "$0")/session_preamble.sh"
source "$(dirname "$0")/smollm2_env.sh"
timeout 560 python3 benchmarks/device/dvr_ab.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --variants risk_0.125,default,risk_0.125_all --budget-s 150 --warmup-requests 16 --warmup-modes dvr@50 \
    --online-load 0.7 --online-modes nondet,dvr@50 --online-requests 500 --online-budget-s 120 \
    --out "$OUT/dvr_ab_smollm2_r24_d.json" >"$OUT/dvr_ab_smollm2.txt" 2>&1
log "dvr_ab smollm2 exit $?"
grep -E "^\[dvr_ab\]|rror" "$OUT/dvr_ab_smollm2.txt" | grep -v warm-up | tail -n 30
log "done"
