#!/usr/bin/env bash
# Round 25, device call D (carries .dev_stage/b, right after call C): the real SmolLM2, 1,000 chat requests, the
# default engine beside the canonical pass confined to 32 and 64 SMs (DVRGenerator(canonical_sms=)); offline
# nondet / dvr@10 / dvr@50, then online (Poisson at 0.7 x capacity, 500 requests) nondet and dvr@50. Each finished
# run is in the JSON even if the call is cut.
#
#   bash benchmarks/device/r25_call_d.sh
source "$(dirname "$0")/session_preamble.sh"
source "$(dirname "$0")/smollm2_env.sh"
timeout 570 python3 benchmarks/device/dvr_ab.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --variants default,sms_32,sms_64 --modes nondet,dvr@10,dvr@50 --budget-s 240 \
    --online-load 0.7 --online-modes nondet,dvr@50 --online-requests 500 --online-budget-s 150 \
    --warmup-requests 8 --warmup-modes dvr@50 --out "$OUT/dvr_ab_smollm2_r25_d.json" >"$OUT/dvr_ab_smollm2.txt" 2>&1
log "dvr_ab smollm2 exit $?"
grep -E "^\[dvr_ab\]|rror" "$OUT/dvr_ab_smollm2.txt" | grep -v warm-up | tail -n 40
log "done"
