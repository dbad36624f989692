#!/usr/bin/env bash
# Round 42, device call B (carry .dev_stage/b, at once after stage_a.sh carried .dev_stage/a): issue 10's SmolLM2
# figures at this tree on whichever card the call gets (the targets name an H200): real SmolLM2, 1,000 chat requests
# offline, nondet / dvr@10 / dvr@50, the default scheduler and DefaultScheduler(order="budget") (each against the
# first variant's nondet and its own), and the pass on a green context of 96 or 64 SMs (canonical_sms; round 40: 96 SMs
# gave the best single p50 at the hand-over, within the spread); then online at 0.7 x the default's nondet capacity,
# 500 requests, nondet and dvr@50, the default against the two green contexts, twice in ABBA order, free requests'
# ITL at the hand-over.
#
#   bash benchmarks/device/r42_call_b.sh
source "$(dirname "$0")/session_preamble.sh"
source "$(dirname "$0")/smollm2_env.sh"
TAG=${TAG:-b}
timeout "${CAP:-560}" python3 benchmarks/device/dvr_ab.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --variants "${VARIANTS:-default,order_budget,sms_96,sms_64}" --modes "${MODES:-nondet,dvr@10,dvr@50}" \
    --budget-s 160 --warmup-requests 8 --warmup-modes dvr@50 --online-load 0.7 --online-modes nondet,dvr@50 \
    --online-variants "${ONLINE_VARIANTS:-default,sms_96,sms_64}" \
    --online-requests "${ONLINE_REQUESTS:-500}" --online-budget-s "${ONLINE_BUDGET:-300}" \
    --online-repeats "${ONLINE_REPEATS:-2}" --out "$OUT/dvr_ab_smollm2_r42_$TAG.json" >"$OUT/dvr_ab_$TAG.txt" 2>&1
log "dvr_ab exit $?"
grep -E "^\[dvr_ab\]|rror|identical" "$OUT/dvr_ab_$TAG.txt" | grep -v warm-up | grep -E "tok/s|median|ITL p50|identical|rror|online|probe" | cut -c1-300 | tail -n 60
log "done"
