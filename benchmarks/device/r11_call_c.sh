#!/usr/bin/env bash
# Round 11, device call C (issue 10): the 8B shape (random weights) with round 5's output head calibrated to
# SmolLM2's flip rate (std 0.2, logit bias 26.9), 1,000 ShareGPT-like requests offline at max_num_seqs 1,024,
# nondet / dvr@10 / dvr@50: the new default fast path against round 10's (split_rows), in one process.
#
#   bash benchmarks/device/r11_call_c.sh [BUDGET_S]
source "$(dirname "$0")/session_preamble.sh"
BUDGET=${1:-420}
timeout $((BUDGET + 100)) python3 benchmarks/device/dvr_ab.py --model 8b --variants default,split_rows \
    --modes nondet,dvr@10,dvr@50 --lm-head-std 0.2 --lm-head-bias-scale 26.9 --max-num-seqs 1024 \
    --budget-s "$BUDGET" --out "$OUT/dvr_ab_8b_calibrated.json" >>"$LOG" 2>&1
log "dvr_ab 8b exit $?"
grep "^\[dvr_ab\]\|num_checked" "$LOG" | tail -n 14
log "done"
