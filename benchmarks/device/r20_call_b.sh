#!/usr/bin/env bash
# Round 20, device call B: this tree's tiled attention (the masked step without a second accumulator, unmasked
# page-id and K/V loads in full blocks, one pass for a tile of one sequence) against round 19's kernel in one
# process (tile_ablation.py, the baseline a copy of 56037d0's module), the canonical bits against round 19's on the
# long prompt's chunks and on the GPU suite's shapes; then the GPU tests of the kernel.
#
#   bash benchmarks/device/r20_call_b.sh
source "$(dirname "$0")/session_preamble.sh"
timeout 330 python3 benchmarks/device/tile_ablation.py --out "$OUT/tile_ablation_b.json" \
    --lengths 15000,8192 --reps 5 --budget-s 250 --bits-seeds 2 >"$OUT/tile_ablation_b.txt" 2>&1
log "ablation exit $?"
grep -E "^L=|^bits" "$OUT/tile_ablation_b.txt" | tail -n 70
timeout 180 python3 -m pytest -v -x -p no:cacheprovider tests/gpu/test_tiled_attention.py \
    -k "canonical_row_bits_do_not_depend_on_the_launch and dtype0 and (-0- or -1-) or kv_does_not_depend_on_chunking or test_tiled_prefill_matches_float64 and 32x8" \
    >"$OUT/gpu_tests_b.txt" 2>&1
log "gpu tests exit $?"
grep -E "PASS|FAIL|ERROR|passed|failed" "$OUT/gpu_tests_b.txt" | tail -n 30
log "done"
