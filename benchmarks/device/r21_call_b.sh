#!/usr/bin/env bash
# Round 21, device call B (carries .dev_stage/b, right after call A): issue 10's served ratios with round 20's
# canonical launch, never measured: the real SmolLM2, 1,000 chat requests offline (nondet / dvr@10 / dvr@50) and
# online at 0.7 x capacity (nondet / dvr@50); then the 8B shape with the output head calibrated to SmolLM2's flip
# rate (nondet / dvr@10).
#
#   bash benchmarks/device/r21_call_b.sh
source "$(dirname "$0")/session_preamble.sh"
source "$(dirname "$0")/smollm2_env.sh"
timeout 300 python3 benchmarks/device/dvr_ab.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --variants default --budget-s 90 --warmup-requests 16 --warmup-modes dvr@50 \
    --online-load 0.7 --online-modes nondet,dvr@50 --online-requests 500 --online-budget-s 50 \
    --out "$OUT/dvr_ab_smollm2_r21_b.json" >>"$LOG" 2>&1
log "dvr_ab smollm2 exit $?"
grep "^\[dvr_ab\]" "$LOG" | grep -v warm-up | tail -n 14
timeout 250 python3 benchmarks/device/dvr_ab.py --model 8b --variants default \
    --modes nondet,dvr@10 --lm-head-std 0.2 --lm-head-bias-scale 26.9 --max-num-seqs 1024 \
    --budget-s 150 --out "$OUT/dvr_ab_8b_r21_b.json" >>"$LOG" 2>&1
log "dvr_ab 8b exit $?"
grep "^\[dvr_ab\]" "$LOG" | grep -v warm-up | tail -n 6
log "done"
