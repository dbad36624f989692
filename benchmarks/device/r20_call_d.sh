#!/usr/bin/env bash
# Round 20, device call D (the final tree): the GPU tests of the canonical launch (round 19's bits, with a negative
# control), the fast configs against float64, row independence, the canonical pass and the engine's needle test;
# long prompts on pages of 16 and of 128 (TMA boxes).
#
#   bash benchmarks/device/r20_call_d.sh
source "$(dirname "$0")/session_preamble.sh"
timeout 170 python3 -m pytest -v -p no:cacheprovider tests/gpu/test_tiled_attention.py \
    -k "test_canonical_launch_keeps_round_19s_bits or test_tiled_prefill_matches_float64 and 32x8 or canonical_row_bits_do_not_depend_on_the_launch and dtype0-0 or kv_does_not_depend_on_chunking or test_decode_launch_gives or test_deterministic_rows_take" \
    >"$OUT/gpu_tests_d.txt" 2>&1
log "tiled attention gpu tests exit $? ($(tail -n 1 "$OUT/gpu_tests_d.txt"))"
grep -E "PASSED|FAILED|ERROR" "$OUT/gpu_tests_d.txt" | tail -n 40
timeout 130 python3 -m pytest -v -p no:cacheprovider tests/gpu/test_engine_cuda.py tests/gpu/test_wide_pass_cuda.py \
    -k "needle or canonical_row_logits or canonical_graph_replay or tile_tables_keep or triton_gemm_commit_the_bits_of_r_row_passes_on_cuda" \
    >"$OUT/gpu_tests_d_engine.txt" 2>&1
log "engine gpu tests exit $? ($(tail -n 1 "$OUT/gpu_tests_d_engine.txt"))"
grep -E "PASSED|FAILED|ERROR" "$OUT/gpu_tests_d_engine.txt" | tail -n 20
for page in 16 128; do
    timeout 80 python3 -m llm42.bench.long_prompts --device cuda --model 8b --lengths 8192,15000 --reps 2 \
        --canonical-gemm triton --canonical-tile-m 128 --block-size $page --budget-s 75 \
        --out "$OUT/long_prompts_d_p$page.json" >"$OUT/long_prompts_d_p$page.txt" 2>&1
    log "long prompts page $page exit $?"
    grep -E "TTFT|det / free|rror" "$OUT/long_prompts_d_p$page.txt" | tail -n 6
done
log "done"
