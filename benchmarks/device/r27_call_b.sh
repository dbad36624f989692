#!/usr/bin/env bash
# Round 27, device call B (carries .dev_stage/b, right after call A): the real SmolLM2, 1,000 chat requests offline
# (nondet / dvr@10 / dvr@50), twice in ABBA order: the default engine; every canonical GEMM at M = 1,024 and 2,048
# (FixedShapePolicy(gemm_rows=N): other committed bits, each its own config); round 26's canonical_priority="high"
# and DefaultScheduler(order="budget"). Each finished run is in the JSON even if the call is cut. Call C follows at
# once (the joined GGUF stays on the warm machine).
#
#   bash benchmarks/device/r27_call_b.sh
source "$(dirname "$0")/session_preamble.sh"
source "$(dirname "$0")/smollm2_env.sh"
timeout 590 python3 benchmarks/device/dvr_ab.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --variants default,gemm_rows_1024,gemm_rows_2048,canon_priority,order_budget --modes nondet,dvr@10,dvr@50 \
    --repeats 2 --budget-s 420 --warmup-requests 8 --warmup-modes dvr@50 \
    --out "$OUT/dvr_ab_smollm2_r27_b.json" >"$OUT/dvr_ab_smollm2.txt" 2>&1
log "dvr_ab smollm2 exit $?"
grep -E "^\[dvr_ab\]|rror" "$OUT/dvr_ab_smollm2.txt" | grep -v warm-up | tail -n 70
log "done"
