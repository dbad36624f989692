#!/usr/bin/env bash
# Round 15, device call A2 (carry .dev_stage/a; copies part_a to /root for call B): call A again after its fixes
# (the GPU tests selected by node id, not -k, which filtered every file; the 8B shape's pass_ab with 64 requests
# in the K/V store, as profile_passes runs it at 6,144 positions), and SmolLM2's shape with 2 streams against 4.
#
#   bash benchmarks/device/r15_call_a2.sh
source "$(dirname "$0")/session_preamble.sh"
timeout 260 python3 -m pytest -q -p no:cacheprovider -m gpu \
    tests/gpu/test_tiled_attention.py::test_tile_table_gives_the_fixed_tilings_bits \
    tests/gpu/test_tiled_attention.py::test_canonical_pass_row_bits_do_not_depend_on_the_pass \
    tests/gpu/test_wide_pass_cuda.py tests/test_close.py tests/gpu/test_canonical_stream_cuda.py \
    >"$OUT/gpu_tests_r15.txt" 2>&1
log "gpu tests exit $? ($(tail -n 1 "$OUT/gpu_tests_r15.txt"))"
grep -E "FAILED|ERROR" "$OUT/gpu_tests_r15.txt" | head -n 20
timeout 170 python3 benchmarks/device/pass_ab.py --model 8b --contexts 600,6144 --reps 10 \
    --variants serial_fixed,streams4_fixed,streams4_tiles --out "$OUT/pass_ab_8b.json" >>"$LOG" 2>&1
log "pass_ab 8b exit $?"
timeout 90 python3 benchmarks/device/pass_ab.py --model smollm2 --contexts 600,2400 \
    --variants serial_fixed,streams2_tiles,streams4_tiles --out "$OUT/pass_ab_smollm2_streams.json" >>"$LOG" 2>&1
log "pass_ab smollm2 streams exit $?"
grep -E "^(verify|ragged|chunk)" "$LOG" | tail -n 16
log "done"
