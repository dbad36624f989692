#!/usr/bin/env bash
# Round 16, device call C: the new default ladder (graph_bucket_step resolved to 128 on the 8B shape): the mixed-step
# GPU tests and the contract test on it, then the 8B shape (round 10's calibrated head), 1,000 offline requests at
# 512 sequences, nondet, the default ladder against powers of two (dvr_ab variants default, pow2_ladder: one
# process, every graph captured before timing).
#
#   bash benchmarks/device/r16_call_c.sh
source "$(dirname "$0")/session_preamble.sh"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_mixed_cuda.py \
    "tests/gpu/test_engine_cuda.py::test_needle_is_bit_identical_alone_and_in_random_batches" \
    >"$OUT/gpu_tests_c.txt" 2>&1
log "gpu tests exit $? ($(tail -n 1 "$OUT/gpu_tests_c.txt"))"
timeout 230 python3 benchmarks/device/dvr_ab.py --model 8b --variants default,pow2_ladder --modes nondet \
    --lm-head-std 0.2 --lm-head-bias-scale 26.9 --max-num-seqs 512 --max-fast-tokens 2048 --budget-s 70 \
    --out "$OUT/dvr_ab_8b_ladder.json" >>"$LOG" 2>&1
log "dvr_ab 8b exit $?"
grep "^\[dvr_ab\]" "$LOG" | tail -n 8
log "done"
