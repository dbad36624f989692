#!/usr/bin/env bash
# Round 33, device call A (no carry): the 8B shape with the calibrated head (the real model's flip rate), nondet and
# dvr@10 on 1,000 requests, the default against DefaultScheduler(order="budget"), ABBA in one process. Round 32
# served the budget order on SmolLM2 (an H100: dvr@10 0.96 / 1.01 against 0.92 / 0.91, dvr@50 0.88 / 0.83 against
# 0.65 / 0.68); the 8B shape's dvr@10 tail was one long deterministic request in round 25 (717), which the budget
# order starts first. Issue 10's target there: 0.90 (0.856 in round 25).
#
#   bash benchmarks/device/r33_call_a.sh
source "$(dirname "$0")/session_preamble.sh"
timeout "${CAP:-560}" python3 benchmarks/device/dvr_ab.py --model 8b --variants "${VARIANTS:-default,order_budget}" \
    --modes nondet,dvr@10 --repeats "${REPEATS:-2}" --lm-head-std 0.2 --lm-head-bias-scale 26.9 --max-num-seqs 1024 \
    --budget-s "${BUDGET:-330}" --warmup-requests 8 --warmup-modes dvr@10 --out "$OUT/dvr_ab_8b_${NAME:-r33_a}.json" \
    >"$OUT/dvr_ab_8b_a.txt" 2>&1
log "dvr_ab 8b exit $?"
grep -E "^\[dvr_ab\]|^\{|rror" "$OUT/dvr_ab_8b_a.txt" | grep -v warm-up | tail -n 24
log "done"
