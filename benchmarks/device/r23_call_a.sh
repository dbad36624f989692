#!/usr/bin/env bash
# Round 23, device call A (carries .dev_stage/a): the chained-pass GPU tests (prompt chunks and, new, verify
# windows behind a held-back pass), then the 8B shape with the output head calibrated to SmolLM2's flip rate,
# 1,000 requests (nondet / dvr@10), side by side in one process: round 22's chaining (prompt chunks only), every
# plan chained (then the default), and every plan chained with eager verification.
#
# The call ran with "all" as the tree's default (its variants were named default / eager then; the JSON keeps those
# names); the variants below are the same engines under their names now.
#
#   bash benchmarks/device/r23_call_a.sh
source "$(dirname "$0")/session_preamble.sh"
timeout 150 python3 -m pytest -q -m gpu tests/gpu/test_chained_prefill_cuda.py -p no:cacheprovider \
    >"$OUT/gpu_tests_a.txt" 2>&1
log "gpu tests (chained passes) exit $?"; tail -n 3 "$OUT/gpu_tests_a.txt"
timeout 430 python3 benchmarks/device/dvr_ab.py --model 8b --variants chain_prompts,chain_all,eager_chain_all \
    --modes nondet,dvr@10 --lm-head-std 0.2 --lm-head-bias-scale 26.9 --max-num-seqs 1024 --budget-s 250 \
    --warmup-requests 8 --warmup-modes dvr@10 --out "$OUT/dvr_ab_8b_r23_a.json" >"$OUT/dvr_ab_8b.txt" 2>&1
log "dvr_ab 8b exit $?"
grep -E "^\[dvr_ab\]|rror" "$OUT/dvr_ab_8b.txt" | grep -v warm-up | tail -n 12
log "done"
