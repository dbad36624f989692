#!/usr/bin/env bash
# Round 25, device call B (carries .dev_stage/b, right after call A): the real SmolLM2, 1,000 chat requests offline,
# the default canonical GEMM beside the Triton GEMM (passes of up to 2,048 and 4,096 rows) with call A's swept pins
# (/root/pins.json, through with_pins.py; the tree's pins when there is none). Each finished run is in the JSON
# even if the call is cut.
#
#   bash benchmarks/device/r25_call_b.sh
source "$(dirname "$0")/session_preamble.sh"
source "$(dirname "$0")/smollm2_env.sh"
WRAP=()
[ -f /root/pins.json ] && cp /root/pins.json "$OUT/pins.json" && WRAP=(benchmarks/device/with_pins.py /root/pins.json)
timeout 500 python3 "${WRAP[@]}" benchmarks/device/dvr_ab.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --variants default,triton_gemm,triton_gemm_4096 --modes nondet,dvr@10,dvr@50 --budget-s 60 \
    --warmup-requests 8 --warmup-modes dvr@50 --out "$OUT/dvr_ab_smollm2_r25_b.json" >"$OUT/dvr_ab_smollm2.txt" 2>&1
log "dvr_ab smollm2 exit $?"
grep -E "^\[dvr_ab\]|with_pins|rror" "$OUT/dvr_ab_smollm2.txt" | grep -v warm-up | tail -n 40
log "done"
