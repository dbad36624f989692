#!/usr/bin/env bash
# Round 22, device call C: the GPU suite (chained prompt passes, fused RoPE, everything else), then long prompts
# on this tree (8B shape, the long-prompt canonical config, 8K / 15K / 32K, median of 3, and the ITL phase), then
# where a 15K prompt's TTFT still goes that no kernel takes (prefill_timeline.py).
#
#   bash benchmarks/device/r22_call_c.sh
source "$(dirname "$0")/session_preamble.sh"
timeout 300 python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider -x >"$OUT/gpu_tests_c.txt" 2>&1
log "gpu tests exit $?"; grep -E "passed|failed|Error|assert" "$OUT/gpu_tests_c.txt" | tail -n 12
timeout 130 python3 -m llm42.bench.long_prompts --device cuda --model 8b --lengths 8192,15000,32768 --reps 3 \
    --canonical-gemm triton --canonical-tile-m 128 --block-size 16 --budget-s 120 --out "$OUT/long_prompts_c.json" \
    >"$OUT/long_prompts_c.txt" 2>&1
log "long prompts exit $?"
grep -E "TTFT [0-9]|gaps while|rror" "$OUT/long_prompts_c.txt" | tail -n 10
timeout 100 python3 benchmarks/device/prefill_timeline.py --out "$OUT/timeline_15k_c.json" --prompt 15000 --reps 3 \
    >"$OUT/timeline_15k_c.txt" 2>&1
log "timeline exit $?"; grep -vE "Warning|warn|gap at" "$OUT/timeline_15k_c.txt" | tail -n 24
log "done"
