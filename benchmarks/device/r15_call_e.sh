#!/usr/bin/env bash
# Round 15, device call E: the tile table's room cut to twice the fixed tiling's tiles (call A2: room for a partial
# tile per sequence made 256-row 8B passes 6-8 % dearer in empty programs). The tile-table GPU tests, then pass_ab:
# the fixed tiling against tile tables, GEMM blocks in turn (the default), the 8B shape and SmolLM2's.
#
#   bash benchmarks/device/r15_call_e.sh
source "$(dirname "$0")/session_preamble.sh"
timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu \
    tests/gpu/test_tiled_attention.py::test_tile_table_gives_the_fixed_tilings_bits >"$OUT/gpu_tests_e.txt" 2>&1
log "tile table tests exit $? ($(tail -n 1 "$OUT/gpu_tests_e.txt"))"
timeout 100 python3 benchmarks/device/pass_ab.py --model 8b --contexts 600,6144 --reps 10 \
    --variants serial_fixed,serial_tiles --out "$OUT/pass_ab_8b_e.json" >>"$LOG" 2>&1
log "pass_ab 8b exit $?"
timeout 50 python3 benchmarks/device/pass_ab.py --model smollm2 --contexts 600,2400 \
    --variants serial_fixed,serial_tiles --out "$OUT/pass_ab_smollm2_e.json" >>"$LOG" 2>&1
log "pass_ab smollm2 exit $?"
grep -E "^(verify|ragged|chunk)" "$LOG" | tail -n 16
log "done"
