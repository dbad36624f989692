#!/usr/bin/env bash
# Round 26, device call D (no carry, within 30 s of call C: the joined SmolLM2 GGUF is still on the machine): the
# timeline of served dvr@50 runs (benchmarks/device/dvr_timeline.py): fast steps' device time alone and beside a
# pass, passes' device time by rows, the device's busy share over the run and in its tail (only deterministic
# requests left), for the default engine, canonical_priority="high" and "prompts", and the 64 x 64-tile Triton GEMM
# with every pass first (each variant's fast steps alone are those no pass overlapped).
#
#   bash benchmarks/device/r26_call_d.sh
source "$(dirname "$0")/session_preamble.sh"
source "$(dirname "$0")/smollm2_env.sh"
timeout 400 python3 benchmarks/device/dvr_timeline.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --variants default,canon_priority,prompt_priority,triton_small_priority --modes dvr@50 --budget-s 120 \
    --warmup-requests 8 --out "$OUT/dvr_timeline_smollm2_r26_d.json" --png "$OUT/dvr_timeline_smollm2_r26_d.png" \
    >"$OUT/dvr_timeline.txt" 2>&1
log "dvr_timeline exit $?"
grep -E "^\[dvr_timeline\]|rror" "$OUT/dvr_timeline.txt" | grep -v warm-up | tail -n 20
log "done"
