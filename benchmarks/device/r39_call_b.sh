#!/usr/bin/env bash
# Round 39, device call B (carry .dev_stage/b, at once after stage_a.sh carried .dev_stage/a, or on the machine an
# earlier call B left warm): free requests' online ITL over nondet, real SmolLM2, for VARIANTS (default: the default
# against apply_before_read, to confirm round 39's first H100 run). Offline nondet and dvr@50 on 1,000 chat
# requests, then online at 0.7 load, 500 requests, nondet and dvr@50, each variant twice in ABBA order; ratios at the
# hand-over and at step return; every step's phases timed. TAG names the output files (several calls, one machine).
#
#   [VARIANTS=default,apply_before_read] [TAG=b] bash benchmarks/device/r39_call_b.sh
#   VARIANTS=apply_before_read,canon_priority,batched TAG=b2 bash benchmarks/device/r39_call_b.sh
source "$(dirname "$0")/session_preamble.sh"
source "$(dirname "$0")/smollm2_env.sh"
TAG=${TAG:-b}
timeout "${CAP:-560}" python3 benchmarks/device/dvr_ab.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --variants "${VARIANTS:-default,apply_before_read}" --modes "${MODES:-nondet,dvr@50}" \
    --budget-s 90 --warmup-requests 8 --warmup-modes dvr@50 --online-load 0.7 --online-modes nondet,dvr@50 \
    --online-requests "${ONLINE_REQUESTS:-500}" --online-budget-s "${ONLINE_BUDGET:-330}" \
    --online-repeats "${ONLINE_REPEATS:-2}" --out "$OUT/dvr_ab_smollm2_r39_$TAG.json" >"$OUT/dvr_ab_$TAG.txt" 2>&1
log "dvr_ab exit $?"
grep -E "^\[dvr_ab\]|rror|identical" "$OUT/dvr_ab_$TAG.txt" | grep -v warm-up | grep -E "tok/s|median|ITL p50|identical|rror|online" | tail -n 60
log "done"
