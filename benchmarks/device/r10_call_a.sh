#!/usr/bin/env bash
# Round 10, device call A (issue 10): copies .dev_stage/a/part_a to /root for call B (when carried); then
# the 8B shape (random weights) with round 5's output head calibrated to SmolLM2's flip rate (std 0.2, logit
# bias 26.9), 1,000 ShareGPT-like requests offline at max_num_seqs 1,024, nondet / dvr@10 / dvr@50 with the
# engine's CUDA defaults, in one process (benchmarks/device/dvr_ab.py).
#
#   bash benchmarks/device/r10_call_a.sh [BUDGET_S]       (OUT=... as the device tool sets it)
source "$(dirname "$0")/session_preamble.sh"
BUDGET=${1:-360}
timeout $((BUDGET + 120)) python3 benchmarks/device/dvr_ab.py --model 8b --variants default \
    --modes nondet,dvr@10,dvr@50 --lm-head-std 0.2 --lm-head-bias-scale 26.9 --max-num-seqs 1024 \
    --budget-s "$BUDGET" --out "$OUT/dvr_ab_8b_calibrated.json" >>"$LOG" 2>&1
log "dvr_ab 8b exit $?"
grep "^\[dvr_ab\]\|num_checked" "$LOG" | tail -n 8
log "done"
