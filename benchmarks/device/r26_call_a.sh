#!/usr/bin/env bash
# Round 26, device call A (carries .dev_stage/a): the GPU tests of the canonical pass's stream (equal, fast-first and,
# new, canonical-first priorities: needles bit-identical in batches beside passes), the green-context and batch-invariant
# matmul tests round 25's review touched, then the 8B shape with the calibrated head: the default engine against
# DVRGenerator(canonical_priority="high"), nondet and dvr@10 on 1,000 requests.
#
#   bash benchmarks/device/r26_call_a.sh
source "$(dirname "$0")/session_preamble.sh"
export LLM42_GPU_REPORT="$OUT/gpu_report_a.jsonl"
timeout 220 python3 -m pytest -q -m gpu tests/gpu/test_canonical_stream_cuda.py tests/gpu/test_canonical_sms_cuda.py \
    tests/test_batch_invariant.py -p no:cacheprovider >"$OUT/gpu_tests_a.txt" 2>&1
log "gpu tests exit $?"; tail -n 4 "$OUT/gpu_tests_a.txt"
timeout 340 python3 benchmarks/device/dvr_ab.py --model 8b --variants default,canon_priority --modes nondet,dvr@10 \
    --lm-head-std 0.2 --lm-head-bias-scale 26.9 --max-num-seqs 1024 --budget-s 200 \
    --warmup-requests 8 --warmup-modes dvr@10 --out "$OUT/dvr_ab_8b_r26_a.json" >"$OUT/dvr_ab_8b.txt" 2>&1
log "dvr_ab 8b exit $?"
grep -E "^\[dvr_ab\]|rror" "$OUT/dvr_ab_8b.txt" | tail -n 14
log "done"
