#!/usr/bin/env bash
# Next device call C (no carry): the 8B shape offline (1,000 requests, 1,024 sequences, admission by budget,
# nondet) with the Gumbel sweep skipping greedy rows and split over ~1,024 programs ("admit_budget_gumbel_lean")
# against the default ("admit_budget"), ABBA in one process; then dvr@10 under the default admission, the
# configuration that met issue 10's 0.90 in round 45 (0.936), with the fused sampler (one run).
#
#   [DVR_CAP=0] bash benchmarks/device/r51_call_c.sh     (DVR_CAP=0: the A/B alone)
source "$(dirname "$0")/session_preamble.sh"
ARGS="--model 8b --lm-head-std 0.2 --lm-head-bias-scale 26.9 --max-num-seqs 1024 --warmup-requests 4"
# shellcheck disable=SC2086  # ARGS is a list of options
timeout "${AB_CAP:-330}" python3 benchmarks/device/dvr_ab.py $ARGS --variants admit_budget,admit_budget_gumbel_lean \
    --modes nondet --repeats 2 --budget-s 100 --out "$OUT/dvr_ab_8b_lean.json" >"$OUT/dvr_ab_8b_lean.txt" 2>&1
log "8b lean A/B exit $?"; grep -E "tok/s|median" "$OUT/dvr_ab_8b_lean.txt" | cut -c1-200 | tail -n 8
[ "${DVR_CAP:-200}" -gt 0 ] || { log "done (DVR_CAP=0: no dvr@10 run)"; exit 0; }
# shellcheck disable=SC2086
timeout "${DVR_CAP:-200}" python3 benchmarks/device/dvr_ab.py $ARGS --variants default --modes nondet,dvr@10 \
    --budget-s 90 --out "$OUT/dvr_ab_8b_dvr10.json" >"$OUT/dvr_ab_8b_dvr10.txt" 2>&1
log "8b dvr@10 exit $?"; grep -E "tok/s" "$OUT/dvr_ab_8b_dvr10.txt" | cut -c1-200 | tail -n 3
log "done"
