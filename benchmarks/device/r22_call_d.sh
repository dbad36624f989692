#!/usr/bin/env bash
# Round 22, device call D: the GPU tests this round touches (chained prompt passes, fused RoPE, the canonical
# stream, wide passes, mixed steps, long contexts), then long prompts again (8K / 15K, median of 3: a second
# process for the spread).
#
#   bash benchmarks/device/r22_call_d.sh
source "$(dirname "$0")/session_preamble.sh"
export LLM42_GPU_REPORT="$OUT/gpu_report_d.jsonl"
timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_chained_prefill_cuda.py \
    tests/gpu/test_fused.py tests/gpu/test_canonical_stream_cuda.py tests/gpu/test_wide_pass_cuda.py \
    tests/gpu/test_mixed_cuda.py tests/gpu/test_long_context_cuda.py >"$OUT/gpu_tests_d.txt" 2>&1
log "gpu tests exit $?"; grep -E "passed|failed|FAILED|Error" "$OUT/gpu_tests_d.txt" | tail -n 12
cat "$LLM42_GPU_REPORT" 2>/dev/null | grep chained
timeout 110 python3 -m llm42.bench.long_prompts --device cuda --model 8b --lengths 8192,15000 --reps 3 \
    --canonical-gemm triton --canonical-tile-m 128 --block-size 16 --budget-s 100 --out "$OUT/long_prompts_d.json" \
    >"$OUT/long_prompts_d.txt" 2>&1
log "long prompts exit $?"
grep -E "TTFT [0-9]|gaps while|rror" "$OUT/long_prompts_d.txt" | tail -n 8
log "done"
