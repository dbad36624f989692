#!/usr/bin/env bash
# Round 20, device call C: long prompts (8B shape, the long-prompt canonical config) on round 19's tiled attention and
# on this tree's, side by side in one call; this tree's canonical launch against round 19's, bits and rate
# (tile_ablation.py); the GPU tests of the tile table and the canonical pass.
#
#   bash benchmarks/device/r20_call_c.sh
source "$(dirname "$0")/session_preamble.sh"
LP="--device cuda --model 8b --lengths 8192,15000 --reps 2 --canonical-gemm triton --canonical-tile-m 128 --block-size 16 --budget-s 80"
timeout 85 python3 benchmarks/device/with_r19_attention.py -m llm42.bench.long_prompts $LP \
    --out "$OUT/long_prompts_r19_kernel.json" >"$OUT/long_prompts.txt" 2>&1
log "long prompts, round 19's kernel, exit $?"
timeout 85 python3 -m llm42.bench.long_prompts $LP --out "$OUT/long_prompts_r20_kernel.json" >>"$OUT/long_prompts.txt" 2>&1
log "long prompts, this tree's kernel, exit $?"
grep -E "TTFT|det / free|rror|with_r19" "$OUT/long_prompts.txt" | tail -n 14
timeout 250 python3 benchmarks/device/tile_ablation.py --out "$OUT/tile_ablation_c.json" --lengths 15000 --reps 5 \
    --budget-s 90 --bits-seeds 1 --bits-shapes 2 --bits-dtypes bfloat16,float16 >"$OUT/tile_ablation_c.txt" 2>&1
log "ablation exit $?"
grep -E "^L=|^bits|Error" "$OUT/tile_ablation_c.txt" | tail -n 40
timeout 110 python3 -m pytest -v -p no:cacheprovider tests/gpu/test_tiled_attention.py \
    -k "test_tile_table_gives_the_fixed_tilings_bits or test_tile128_tile_table_and_decode_launch or test_canonical_pass_row_bits_do_not_depend_on_the_pass" \
    >"$OUT/gpu_tests_c.txt" 2>&1
log "gpu tests exit $?"
grep -E "PASSED|FAILED|ERROR|passed|failed" "$OUT/gpu_tests_c.txt" | tail -n 20
log "done"
