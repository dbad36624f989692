#!/usr/bin/env bash
# Round 24, device call B (carries .dev_stage/b, right after call A): the real SmolLM2, 1,000 chat requests offline
# (nondet / dvr@10 / dvr@50) and online at 0.7 x capacity (nondet / dvr@50), side by side in one process: the
# default engine (no window closed early; it also counts drafts by margin as passes verify them) and windows
# closed at drafts of margin under 0.0625 and 0.25 logits (DVRGenerator(risk_margin=...)).
#
#   bash benchmarks/device/r24_call_b.sh
source "$(dirname "$0")/session_preamble.sh"
source "$(dirname "$0")/smollm2_env.sh"
timeout 560 python3 benchmarks/device/dvr_ab.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --variants default,risk_0.06,risk_0.25 --budget-s 150 --warmup-requests 16 --warmup-modes dvr@50 \
    --online-load 0.7 --online-modes nondet,dvr@50 --online-requests 500 --online-budget-s 120 \
    --out "$OUT/dvr_ab_smollm2_r24_b.json" >"$OUT/dvr_ab_smollm2.txt" 2>&1
log "dvr_ab smollm2 exit $?"
grep -E "^\[dvr_ab\]|rror" "$OUT/dvr_ab_smollm2.txt" | grep -v warm-up | tail -n 30
log "done"
