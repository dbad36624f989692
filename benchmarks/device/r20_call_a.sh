#!/usr/bin/env bash
# Round 20, device call A: what holds the engine's tiled attention below the minimal paged kernel on a long
# prompt's chunks (tile_ablation.py: GQA packing, FMA contraction, the group loop, page ids ahead, 8 warps at the
# canonical 128-row tile, cuDNN on gathered keys), and the canonical bits of each variant against the launch's.
# Then the canonical row-bit tests on the refactored kernel (the group loop now calls _group_pass).
#
#   bash benchmarks/device/r20_call_a.sh
source "$(dirname "$0")/session_preamble.sh"
timeout 400 python3 benchmarks/device/tile_ablation.py --out "$OUT/tile_ablation.json" \
    --lengths 15000,8192 --reps 5 --budget-s 360 >"$OUT/tile_ablation.txt" 2>&1
log "ablation exit $?"
grep -E "^L=" "$OUT/tile_ablation.txt" | tail -n 70
timeout 130 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_tiled_attention.py \
    -k "canonical_row_bits_do_not_depend_on_the_launch and bfloat16 and (seed0 or seed1)" >"$OUT/gpu_tests.txt" 2>&1
log "gpu tests exit $?"
tail -n 5 "$OUT/gpu_tests.txt"
log "done"
