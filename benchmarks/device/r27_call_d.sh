#!/usr/bin/env bash
# Round 27, device call D (no carry; optional, after A-C if device time is left): the 8B shape with the calibrated
# head, nondet and dvr@10 on 1,000 requests: the default engine against round 26's canonical_priority="high" and
# budget order with prompt passes first (the 8B dvr@10 tail is one long deterministic request, 717), and
# adaptive_draft (a window halved after a rollback: on this shape 53 % of rejected drafts had margins >= 2 logits in
# round 25, out of risk_margin's reach, and each rollback costs ~(window - flip + turnaround) steps of ~35 ms).
#
#   bash benchmarks/device/r27_call_d.sh
source "$(dirname "$0")/session_preamble.sh"
timeout 560 python3 benchmarks/device/dvr_ab.py --model 8b --variants default,canon_priority,order_budget_prompts,adaptive \
    --modes nondet,dvr@10 --lm-head-std 0.2 --lm-head-bias-scale 26.9 --max-num-seqs 1024 --budget-s 300 \
    --warmup-requests 8 --warmup-modes dvr@10 --out "$OUT/dvr_ab_8b_r27_d.json" >"$OUT/dvr_ab_8b_d.txt" 2>&1
log "dvr_ab 8b exit $?"
grep -E "^\[dvr_ab\]|rror" "$OUT/dvr_ab_8b_d.txt" | tail -n 14
log "done"
