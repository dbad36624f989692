#!/usr/bin/env bash
# Round 25, device call F (carries .dev_stage/b, right after call E): the real SmolLM2, 1,000 chat requests offline
# (nondet / dvr@10 / dvr@50), the default canonical GEMM (cuBLAS on 256-row blocks) beside the Triton GEMM with the
# tree's pins (round 25's sweep) and with 64 x 64 tiles on the layer weights (dvr_ab.py's triton_small: a quarter of
# the shared memory per program). Each finished run is in the JSON even if the call is cut.
#
#   bash benchmarks/device/r25_call_f.sh
source "$(dirname "$0")/session_preamble.sh"
source "$(dirname "$0")/smollm2_env.sh"
timeout 400 python3 benchmarks/device/dvr_ab.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --variants default,triton_gemm,triton_small --modes nondet,dvr@10,dvr@50 --budget-s 200 \
    --warmup-requests 8 --warmup-modes dvr@50 --out "$OUT/dvr_ab_smollm2_r25_f.json" >"$OUT/dvr_ab_smollm2.txt" 2>&1
log "dvr_ab smollm2 exit $?"
grep -E "^\[dvr_ab\]|rror" "$OUT/dvr_ab_smollm2.txt" | grep -v warm-up | tail -n 30
log "done"
