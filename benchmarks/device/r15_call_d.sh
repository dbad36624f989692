#!/usr/bin/env bash
# Round 15, device call D (carry .dev_stage/b, right after a call that carried .dev_stage/a and sourced
# session_preamble.sh to copy part_a to /root): the final tree's default (tile tables on, GEMM blocks in turn) against
# round 14's canonical pass, real SmolLM2, 1,000 chat requests offline (nondet / dvr@10 / dvr@50) and online at
# 0.7 x capacity. Run as one inline command in round 15; the same command here.
#
#   bash benchmarks/device/r15_call_d.sh
source "$(dirname "$0")/session_preamble.sh"
source "$(dirname "$0")/smollm2_env.sh"
timeout 480 python3 benchmarks/device/dvr_ab.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --variants default,round14_pass --budget-s 120 --warmup-requests 16 --warmup-modes dvr@50 \
    --online-load 0.7 --online-modes nondet,dvr@50 --online-requests 500 --online-budget-s 60 \
    --out "$OUT/dvr_ab_smollm2_r15_d.json" >>"$LOG" 2>&1
log "dvr_ab exit $?"
grep "^\[dvr_ab\]" "$LOG" | grep -v warm-up | tail -n 20
