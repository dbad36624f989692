#!/usr/bin/env bash
# Round 18, device call B: the TMA tiles pinned for the 8B shape's GEMMs (the Triton canonical GEMM's new bits) and
# the 128-row canonical tile, on long deterministic prompts. GPU tests first (the pinned TMA tiles' rows their own,
# wide passes with the Triton GEMM commit R-row passes' bits; tile 128's own contract), then long_prompts in three
# processes: FixedShapePolicy(gemm="triton", tile_m=128), the default config, and tile_m=128 alone.
#
#   bash benchmarks/device/r18_call_b.sh
source "$(dirname "$0")/session_preamble.sh"
timeout 75 python3 -m pytest -q -rA -p no:cacheprovider tests/test_batch_invariant.py tests/gpu/test_wide_pass_cuda.py \
    -k "tma or pinned_tiles_keep_every or triton" >"$OUT/gpu_tests_b1.txt" 2>&1
log "gpu tests (GEMM) exit $? ($(tail -n 1 "$OUT/gpu_tests_b1.txt"))"
timeout 75 python3 -m pytest -q -rA -p no:cacheprovider tests/gpu/test_tiled_attention.py \
    -k "tile128 or pass_row_bits" >"$OUT/gpu_tests_b2.txt" 2>&1
log "gpu tests (tile 128) exit $? ($(tail -n 1 "$OUT/gpu_tests_b2.txt"))"
run_lp() {  # name, extra args
    local name=$1; shift
    timeout 140 python3 -m llm42.bench.long_prompts --device cuda --model 8b --lengths 8192,15000 --reps 2 \
        --budget-s 110 --out "$OUT/long_prompts_$name.json" "$@" >"$OUT/long_prompts_$name.txt" 2>&1
    log "long_prompts $name exit $?"
    tail -n 8 "$OUT/long_prompts_$name.txt"
}
run_lp triton_tile128 --canonical-gemm triton --canonical-tile-m 128
run_lp default
run_lp tile128 --canonical-tile-m 128
log "done"
