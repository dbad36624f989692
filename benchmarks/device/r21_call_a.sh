#!/usr/bin/env bash
# Round 21, device call A (carries .dev_stage/a: the preamble copies part_a to /root for call B): the canonical
# Triton GEMM's scheduling options (flattened tile/K pipeline, TMA-store epilogue) and other tiles on the 8B shape's
# pinned TMA configs, time and bits (each group of variants in its own process under a timeout); the GPU tests of
# the TMA GEMM.
#
#   bash benchmarks/device/r21_call_a.sh
source "$(dirname "$0")/session_preamble.sh"
timeout 470 python3 benchmarks/device/gemm_schedule.py --out "$OUT/gemm_schedule.json" --rows 2048 --reps 20 \
    --timeout-s 70 >"$OUT/gemm_schedule.txt" 2>&1
log "gemm_schedule exit $?"
grep -E "^\[gemm|sum over|OTHER" "$OUT/gemm_schedule.txt" | tail -n 40
timeout 70 python3 -m pytest -v -p no:cacheprovider tests/test_batch_invariant.py -k "tma_tiles_keep_every or pinned_tiles_keep_every" \
    >"$OUT/gpu_tests_a.txt" 2>&1
log "gpu tests exit $? ($(tail -n 1 "$OUT/gpu_tests_a.txt"))"
log "done"
