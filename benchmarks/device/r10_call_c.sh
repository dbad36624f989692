#!/usr/bin/env bash
# Round 10, device call C (issue 10): the 8B shape (random weights, the calibrated head of call A), 1,000
# ShareGPT-like requests offline, nondet only, at max_num_seqs 256 and 512 (call A ran 1,024), one process each.
#
#   bash benchmarks/device/r10_call_c.sh [BUDGET_S]       (OUT=... as the device tool sets it)
source "$(dirname "$0")/session_preamble.sh"
BUDGET=${1:-110}
for SEQS in 256 512; do
    timeout $((BUDGET + 90)) python3 benchmarks/device/dvr_ab.py --model 8b --variants default --modes nondet \
        --lm-head-std 0.2 --lm-head-bias-scale 26.9 --max-num-seqs "$SEQS" --budget-s "$BUDGET" \
        --out "$OUT/dvr_ab_8b_nondet_seqs$SEQS.json" >>"$LOG" 2>&1
    log "dvr_ab 8b max_num_seqs $SEQS exit $?"
done
grep "^\[dvr_ab\]" "$LOG" | tail -n 8
log "done"
