#!/usr/bin/env bash
# Round 18, device call A: the 128-row canonical tile (FixedShapePolicy(tile_m=128)) and the TMA Triton GEMM.
# GPU tests of both (tile 128's own contract: rows their own, K/V independent of chunking, tile tables, the decode
# launch, whole passes; the TMA kernel's rows their own at model widths), the GEMM sweep of the TMA tiles against
# the pinned pointer tiles and cuBLAS, and canonical passes side by side (pass_ab: 64- vs 128-row tiles, cuBLAS vs
# the Triton GEMM; equal_to_first says whether tile 128 gives the default's tokens and log-probs on this GPU).
#
#   bash benchmarks/device/r18_call_a.sh
source "$(dirname "$0")/session_preamble.sh"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_tiled_attention.py tests/test_batch_invariant.py \
    -k "tile128 or pass_row_bits or tma or pinned_tiles" >"$OUT/gpu_tests_a.txt" 2>&1
log "gpu tests exit $? ($(tail -n 1 "$OUT/gpu_tests_a.txt"))"
timeout 170 python3 benchmarks/device/gemm_config_sweep.py --out "$OUT/gemm_sweep_tma.json" --models 8b,smollm2 \
    --rows 256,1024,2048 --reps 10 --candidates tma >"$OUT/gemm_sweep_tma.txt" 2>&1
log "gemm sweep exit $?"
cat "$OUT/gemm_sweep_tma.txt" | tail -n 12
timeout 130 python3 benchmarks/device/pass_ab.py --out "$OUT/pass_ab_8b_tile.json" --model 8b --contexts 600,6144 \
    --variants serial_tiles,tile128,triton,tile128_triton --reps 8 --warmup 2 >"$OUT/pass_ab_8b_tile.txt" 2>&1
log "pass_ab 8b exit $?"
cat "$OUT/pass_ab_8b_tile.txt" | tail -n 10
timeout 90 python3 benchmarks/device/pass_ab.py --out "$OUT/pass_ab_smollm2_tile.json" --model smollm2 \
    --contexts 600,2400 --variants serial_tiles,tile128 --reps 12 --warmup 2 >"$OUT/pass_ab_smollm2_tile.txt" 2>&1
log "pass_ab smollm2 exit $?"
cat "$OUT/pass_ab_smollm2_tile.txt" | tail -n 10
log "done"
