#!/usr/bin/env bash
# Round 26, device call B (carries .dev_stage/b, right after call A): the real SmolLM2, 1,000 chat requests offline
# (nondet / dvr@10 / dvr@50), twice in ABBA order: the default engine; DVRGenerator(canonical_priority="high") (every
# pass's stream above the fast steps'); canonical_priority="prompts" (only passes with deterministic prompt chunks);
# DefaultScheduler(order="budget") (the largest output budget left first, its nondet too). Each finished run is in the
# JSON even if the call is cut. Call C follows at once (the joined GGUF stays on the warm machine).
#
#   bash benchmarks/device/r26_call_b.sh
source "$(dirname "$0")/session_preamble.sh"
source "$(dirname "$0")/smollm2_env.sh"
timeout 560 python3 benchmarks/device/dvr_ab.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --variants default,canon_priority,prompt_priority,order_budget --modes nondet,dvr@10,dvr@50 --repeats 2 \
    --budget-s 360 --warmup-requests 8 --warmup-modes dvr@50 \
    --out "$OUT/dvr_ab_smollm2_r26_b.json" >"$OUT/dvr_ab_smollm2.txt" 2>&1
log "dvr_ab smollm2 exit $?"
grep -E "^\[dvr_ab\]|rror" "$OUT/dvr_ab_smollm2.txt" | grep -v warm-up | tail -n 60
log "done"
