#!/usr/bin/env bash
# Round 33, device call C (no carry, at once after r33_call_b.sh: the joined SmolLM2 GGUF is still on the machine):
# SmolLM2 online, Poisson at 0.7 x the default's offline nondet capacity, 500 requests, nondet
# and dvr@50, the default against DefaultScheduler(order="budget"): the free requests' ITL p50 / p99 over nondet's
# (issue 10's 1.15x; round 25's default 1.15x / 1.31x). In round 32's offline dvr@50 runs the budget order's free
# ITL p99 was 16.4 ms against the default's 36.9 ms (one sample each, offline): online is what the target asks.
#
#   bash benchmarks/device/r33_call_c.sh
source "$(dirname "$0")/session_preamble.sh"
source "$(dirname "$0")/smollm2_env.sh"
timeout "${CAP:-420}" python3 benchmarks/device/dvr_ab.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --variants default,order_budget --modes nondet --budget-s 60 --warmup-requests 8 --warmup-modes dvr@50 \
    --online-load 0.7 --online-modes nondet,dvr@50 --online-requests 500 --online-budget-s 140 \
    --out "$OUT/dvr_ab_smollm2_r33_b_online.json" >"$OUT/dvr_ab_online.txt" 2>&1
log "dvr_ab online exit $?"
grep -E "^\[dvr_ab\]|rror" "$OUT/dvr_ab_online.txt" | grep -v warm-up | tail -n 30
log "done"
