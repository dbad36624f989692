#!/usr/bin/env bash
# Round 23, device call B (carries .dev_stage/b, right after call A): the real SmolLM2, 1,000 chat requests offline
# (nondet / dvr@10 / dvr@50) and online at 0.7 x capacity (nondet / dvr@50), side by side in one process: round
# 22's chaining (prompt chunks only), every plan chained (then the default), and with eager verification.
#
# The call ran with "all" as the tree's default (its variants were named default / eager then; the JSON keeps those
# names); the variants below are the same engines under their names now.
#
#   bash benchmarks/device/r23_call_b.sh
source "$(dirname "$0")/session_preamble.sh"
source "$(dirname "$0")/smollm2_env.sh"
timeout 540 python3 benchmarks/device/dvr_ab.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --variants chain_prompts,chain_all,eager_chain_all --budget-s 150 --warmup-requests 16 --warmup-modes dvr@50 \
    --online-load 0.7 --online-modes nondet,dvr@50 --online-requests 500 --online-budget-s 120 \
    --out "$OUT/dvr_ab_smollm2_r23_b.json" >"$OUT/dvr_ab_smollm2.txt" 2>&1
log "dvr_ab smollm2 exit $?"
grep -E "^\[dvr_ab\]|rror" "$OUT/dvr_ab_smollm2.txt" | grep -v warm-up | tail -n 30
log "done"
