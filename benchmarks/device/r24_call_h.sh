#!/usr/bin/env bash
# Round 24, device call H (carries .dev_stage/b, right after call G): call F cut down to the session's last device
# time: the default engine, then risky windows riding the next pass at 0.125 logits; real SmolLM2, 1,000 chat
# requests offline, nondet and dvr@50 only, no online phase. Each finished run is in the JSON even if the call is cut.
#
#   bash benchmarks/device/r24_call_h.sh
source "$(dirname "$0")/session_preamble.sh"
source "$(dirname "$0")/smollm2_env.sh"
timeout 225 python3 benchmarks/device/dvr_ab.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --variants default,ride_0.125 --modes nondet,dvr@50 --budget-s 60 --warmup-requests 8 --warmup-modes dvr@50 \
    --out "$OUT/dvr_ab_smollm2_r24_h.json" >"$OUT/dvr_ab_smollm2.txt" 2>&1
log "dvr_ab smollm2 exit $?"
grep -E "^\[dvr_ab\]|rror" "$OUT/dvr_ab_smollm2.txt" | grep -v warm-up | tail -n 30
log "done"
