#!/usr/bin/env bash
# Round 25, device call E (carries .dev_stage/a): the batch-invariant matmul's GPU tests with round 25's SmolLM2 pins
# (tests/test_batch_invariant.py: every pinned shape's rows their own at any M, the new pins' bits equal round 14's),
# then the 8B shape with the calibrated head (round 5), the default engine, nondet and dvr@10 on 1,000 requests.
#
#   bash benchmarks/device/r25_call_e.sh
source "$(dirname "$0")/session_preamble.sh"
timeout 120 python3 -m pytest -q -m gpu tests/test_batch_invariant.py -p no:cacheprovider >"$OUT/gpu_tests_e.txt" 2>&1
log "gpu tests (batch-invariant matmul) exit $?"; tail -n 3 "$OUT/gpu_tests_e.txt"
timeout 330 python3 benchmarks/device/dvr_ab.py --model 8b --variants default --modes nondet,dvr@10 \
    --lm-head-std 0.2 --lm-head-bias-scale 26.9 --max-num-seqs 1024 --budget-s 150 \
    --warmup-requests 8 --warmup-modes dvr@10 --out "$OUT/dvr_ab_8b_r25_e.json" >"$OUT/dvr_ab_8b.txt" 2>&1
log "dvr_ab 8b exit $?"
grep -E "^\[dvr_ab\]|rror" "$OUT/dvr_ab_8b.txt" | grep -v warm-up | tail -n 12
log "done"
