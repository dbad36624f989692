#!/usr/bin/env bash
# Round 19, device call E (final tree): the page-id prefetch for launches of 8+ warps only, the fast path's large
# prefill tiles at 128 x 128 keys, 8 warps, 3 stages. GPU tests (TMA = gathers, full blocks = masked blocks at
# pages of 16 with 16-key blocks, the fast prefill configs against float64, rows their own); a long prompt's chunks
# at pages of 16 (gathers) and 128 (TMA); the 8B long prompts at pages of 16 and 128.
#
#   bash benchmarks/device/r19_call_e.sh
source "$(dirname "$0")/session_preamble.sh"
timeout 130 python3 -m pytest -v -p no:cacheprovider tests/gpu/test_tiled_attention.py \
    -k "kv_tma and (dtype0-64-64 or dtype1-128-128) or unmasked_full_blocks_keep_the_canonical_bits and 32x8 and bfloat16 or test_tiled_prefill_matches_float64 and 32x8 or canonical_row_bits_do_not_depend_on_the_launch and dtype0-0" \
    >"$OUT/gpu_tests_e.txt" 2>&1
log "gpu tests exit $? ($(tail -n 1 "$OUT/gpu_tests_e.txt"))"
grep -E "PASSED|FAILED|ERROR" "$OUT/gpu_tests_e.txt" | tail -n 30
timeout 120 python3 benchmarks/device/prefill_chunk_attention.py --out "$OUT/prefill_chunks_final.json" \
    --lengths 15000,8192 --layouts 16:gather,128:tma --configs short --reps 5 >"$OUT/prefill_chunks_final.txt" 2>&1
log "prefill chunk sweep exit $?"
grep -E "^L=" "$OUT/prefill_chunks_final.txt" | tail -n 40
for page in 16 128; do
    timeout 90 python3 -m llm42.bench.long_prompts --device cuda --model 8b --lengths 8192,15000 --reps 2 \
        --canonical-gemm triton --canonical-tile-m 128 --block-size $page --budget-s 85 \
        --out "$OUT/long_prompts_final_p$page.json" >"$OUT/long_prompts_final_p$page.txt" 2>&1
    log "long prompts page $page exit $?"
    grep -E "TTFT|det / free|rror" "$OUT/long_prompts_final_p$page.txt" | tail -n 6
done
log "done"
