#!/usr/bin/env bash
# Round 14, device call F2, right after r14_call_f1.sh (carry .dev_stage/b): real SmolLM2, free requests'
# inter-token gaps online (Poisson at 0.7 x the offline nondet capacity, 500 requests, nondet and dvr@50) with the
# default engine against prioritize_fast=True, one process; offline nondet only (the capacity), no warm-up runs
# (each run's budget counts from its first request; graphs are captured before it).
source "$(dirname "$0")/session_preamble.sh"
source "$(dirname "$0")/smollm2_env.sh"
timeout 330 python3 benchmarks/device/dvr_ab.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --variants split_rows,priority --modes nondet --budget-s 40 --warmup-requests 0 \
    --online-load 0.7 --online-modes nondet,dvr@50 --online-requests 500 --online-budget-s 80 \
    --out "$OUT/dvr_ab_smollm2_r14_priority.json" >>"$LOG" 2>&1
log "dvr_ab exit $?"
grep "^\[dvr_ab\]" "$LOG" | tail -n 20
log "done"
