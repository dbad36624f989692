#!/usr/bin/env bash
# Round 38, device call C (on the machine call B left warm: the joined GGUF is still under /root): the online device
# timeline of dvr@50 (dvr_timeline.py --online-load, never run on a GPU before): each fast step's and each canonical
# pass's device span from CUDA events, whether a fast step beside a pass is longer for its rows, how long a served
# pass takes, how busy the device is; default against pass_before_read. Real SmolLM2, 500 requests at 0.7 load.
#
#   bash benchmarks/device/r38_call_c.sh
source "$(dirname "$0")/session_preamble.sh"
source "$(dirname "$0")/smollm2_env.sh"
timeout "${CAP:-240}" python3 benchmarks/device/dvr_timeline.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --variants "${VARIANTS:-default,pass_before_read}" --modes dvr@50 --online-load 0.7 --online-requests 500 \
    --budget-s 120 --warmup-requests 8 --png "$OUT/timeline_online_smollm2.png" \
    --out "$OUT/timeline_online_smollm2.json" >"$OUT/timeline.txt" 2>&1
log "timeline exit $?"; grep -E "^\[dvr_timeline\]|rror" "$OUT/timeline.txt" | tail -n 16
log "done"
