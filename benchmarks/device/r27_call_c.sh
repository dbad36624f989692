#!/usr/bin/env bash
# Round 27, device call C (no carry, within 30 s of call B: the joined SmolLM2 GGUF is still on the machine): online,
# Poisson at 0.7 x the default's offline nondet capacity, 500 requests, nondet and dvr@50 (free requests' ITL over
# nondet's: issue 10's 1.15x) for the default, gemm_rows_1024, canon_priority and order_budget_prompts; then the
# served dvr@50 timelines (dvr_timeline.py: fast steps alone / beside a pass, passes by rows, busy shares, the tail)
# of the default and gemm_rows_1024, with where the deterministic requests' steps go (--det-progress 4: every 4th step).
#
#   bash benchmarks/device/r27_call_c.sh
source "$(dirname "$0")/session_preamble.sh"
source "$(dirname "$0")/smollm2_env.sh"
timeout 300 python3 benchmarks/device/dvr_ab.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --variants default,gemm_rows_1024,canon_priority,order_budget_prompts --modes nondet --budget-s 60 \
    --warmup-requests 8 --warmup-modes dvr@50 --online-load 0.7 --online-modes nondet,dvr@50 --online-requests 500 \
    --online-budget-s 140 --out "$OUT/dvr_ab_smollm2_r27_c_online.json" >"$OUT/dvr_ab_online.txt" 2>&1
log "dvr_ab online exit $?"
grep -E "^\[dvr_ab\]|rror" "$OUT/dvr_ab_online.txt" | grep -v warm-up | tail -n 30
timeout 220 python3 benchmarks/device/dvr_timeline.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --variants default,gemm_rows_1024 --modes dvr@50 --budget-s 60 --warmup-requests 8 --det-progress 4 \
    --out "$OUT/dvr_timeline_smollm2_r27_c.json" --png "$OUT/dvr_timeline_smollm2_r27_c.png" \
    >"$OUT/dvr_timeline.txt" 2>&1
log "dvr_timeline exit $?"
grep -E "^\[dvr_timeline\]|rror" "$OUT/dvr_timeline.txt" | grep -v warm-up | tail -n 20
log "done"
