#!/usr/bin/env bash
# Round 15, device call A (carry .dev_stage/a; copies part_a to /root for call B). The GPU tests of this round's
# canonical-pass changes (tile tables for the tiled canonical attention at model shapes; wide passes with their
# GEMM blocks on 4 and on 1 stream and tile tables against R-row passes without; the generator's memory going
# with it; the canonical stream's contract), then pass_ab.py: canonical passes of each variant side by side in one
# process, SmolLM2's shape at 600 / 2,400 positions and the 8B shape at 600 / 6,144.
#
#   bash benchmarks/device/r15_call_a.sh
source "$(dirname "$0")/session_preamble.sh"
timeout 230 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_tiled_attention.py -k tile_table \
    tests/gpu/test_wide_pass_cuda.py tests/test_close.py tests/gpu/test_canonical_stream_cuda.py \
    >"$OUT/gpu_tests_r15.txt" 2>&1
log "gpu tests exit $? ($(tail -n 1 "$OUT/gpu_tests_r15.txt"))"
grep -E "FAILED|ERROR" "$OUT/gpu_tests_r15.txt" | head -n 20
timeout 120 python3 benchmarks/device/pass_ab.py --model smollm2 --contexts 600,2400 \
    --variants serial_fixed,streams4_fixed,streams8_fixed,serial_tiles,streams4_tiles \
    --out "$OUT/pass_ab_smollm2.json" >>"$LOG" 2>&1
log "pass_ab smollm2 exit $?"
timeout 170 python3 benchmarks/device/pass_ab.py --model 8b --contexts 600,6144 --reps 10 \
    --variants serial_fixed,streams4_fixed,streams4_tiles --out "$OUT/pass_ab_8b.json" >>"$LOG" 2>&1
log "pass_ab 8b exit $?"
grep -E "^(verify|ragged|chunk)" "$LOG" | tail -n 16
log "done"
