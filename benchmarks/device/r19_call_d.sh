#!/usr/bin/env bash
# Round 19, device call D: the tiled attention loads the next key block's page ids while a block runs (call C: a
# K/V load waiting on a table load cost the minimal kernel 316 -> 368 TFLOP/s). The GPU tests of the canonical
# launch's bits (full blocks = masked blocks, rows their own, TMA = gathers); a long prompt's chunks at pages of
# 16 and 64 (TMA); the 8B long prompts with the long-prompt canonical config at pages of 16 and 64.
#
#   bash benchmarks/device/r19_call_d.sh
source "$(dirname "$0")/session_preamble.sh"
timeout 110 python3 benchmarks/device/prefill_chunk_attention.py --out "$OUT/prefill_chunks_prefetch.json" \
    --lengths 15000,8192 --layouts 16:gather,64:tma --configs short --reps 5 >"$OUT/prefill_chunks_prefetch.txt" 2>&1
log "prefill chunk sweep exit $?"
grep -E "^L=" "$OUT/prefill_chunks_prefetch.txt" | tail -n 40
timeout 110 python3 -m pytest -v -p no:cacheprovider tests/gpu/test_tiled_attention.py \
    -k "unmasked_full_blocks_keep_the_canonical_bits and 32x8 or canonical_row_bits_do_not_depend_on_the_launch and (seed0 or seed1 or 0-unmasked or 1-unmasked) or kv_tma and dtype0-64-64 or check_can_fail" \
    >"$OUT/gpu_tests_d.txt" 2>&1
log "gpu tests exit $? ($(tail -n 1 "$OUT/gpu_tests_d.txt"))"
grep -E "PASSED|FAILED|ERROR" "$OUT/gpu_tests_d.txt" | tail -n 30
for page in 16 64; do
    timeout 90 python3 -m llm42.bench.long_prompts --device cuda --model 8b --lengths 8192,15000 --reps 2 \
        --canonical-gemm triton --canonical-tile-m 128 --block-size $page --budget-s 85 \
        --out "$OUT/long_prompts_prefetch_p$page.json" >"$OUT/long_prompts_prefetch_p$page.txt" 2>&1
    log "long prompts page $page exit $?"
    grep -E "TTFT|det / free" "$OUT/long_prompts_prefetch_p$page.txt" | tail -n 6
done
log "done"
