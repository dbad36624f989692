#!/usr/bin/env bash
# Round 19, device call A: K/V through TMA descriptors in the tiled attention (pages a multiple of the key block).
# The GPU tests that TMA boxes give the gathers' bits and that the full-block step keeps the masked step's bits; a long prompt's prefill attention chunk by chunk at pages of
# 16 (gathers), 64 (gathers, TMA) and 128 (TMA); the 8B long prompts with the long-prompt canonical config at
# pages of 16 and 64 (two processes).
#
#   bash benchmarks/device/r19_call_a.sh
source "$(dirname "$0")/session_preamble.sh"
timeout 150 python3 -m pytest -v -p no:cacheprovider tests/gpu/test_tiled_attention.py -k "kv_tma or unmasked_full_blocks" \
    >"$OUT/gpu_tests_a.txt" 2>&1
log "gpu tests exit $? ($(tail -n 1 "$OUT/gpu_tests_a.txt"))"
grep -E "PASSED|FAILED|ERROR" "$OUT/gpu_tests_a.txt" | tail -n 20
timeout 170 python3 benchmarks/device/prefill_chunk_attention.py --out "$OUT/prefill_chunks_tma.json" \
    --lengths 8192,15000 --layouts 16:gather,64:gather,64:tma,128:tma --configs short --reps 5 \
    >"$OUT/prefill_chunks_tma.txt" 2>&1
log "prefill chunk sweep exit $?"
cat "$OUT/prefill_chunks_tma.txt" | tail -n 70
for page in 16 64; do
    timeout 110 python3 -m llm42.bench.long_prompts --device cuda --model 8b --lengths 8192,15000 --reps 2 \
        --canonical-gemm triton --canonical-tile-m 128 --block-size $page --budget-s 100 \
        --out "$OUT/long_prompts_p$page.json" >"$OUT/long_prompts_p$page.txt" 2>&1
    log "long prompts page $page exit $?"
    grep -E "TTFT|det / free" "$OUT/long_prompts_p$page.txt" | tail -n 8
done
log "done"
