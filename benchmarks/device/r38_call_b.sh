#!/usr/bin/env bash
# Round 38, device call B (carry .dev_stage/b, at once after stage_a.sh carried .dev_stage/a): free requests' online
# ITL with tokens handed over before each step's canonical phase (step(deliver=...), round 37), default against
# pass_before_read (the pass's launch under the read's wait) and pass_before_read_split (the same, and a step that
# applies a pass launches none: at most one of the two host phases a step). Real SmolLM2: offline nondet and dvr@50,
# then online at 0.7 load, 500 requests, nondet and dvr@50, twice in ABBA order, every step's phases timed.
#
#   bash benchmarks/device/r38_call_b.sh
#
# ROUND and TAG name the output files (dvr_ab_smollm2_${ROUND}_${TAG}.json, dvr_ab_${TAG}.txt; r39_call_b.sh sets them).
# BUDGET: the offline runs' --budget-s (90); ONLINE_VARIANTS: the variants served online (default: every variant;
# r42_call_b.sh sets both); ONLINE_LOAD: the online runs' load (0.7; ONLINE_LOAD= runs offline only).
source "$(dirname "$0")/session_preamble.sh"
source "$(dirname "$0")/smollm2_env.sh"
ROUND=${ROUND:-r38}
ONLINE_LOAD=${ONLINE_LOAD-0.7}  # set and empty: no online runs (round 43's call F served them with ONLINE_VARIANTS=)
TAG=${TAG:-b}
timeout "${CAP:-560}" python3 benchmarks/device/dvr_ab.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --variants "${VARIANTS:-default,pass_before_read,pass_before_read_split}" --modes "${MODES:-nondet,dvr@50}" \
    --budget-s "${BUDGET:-90}" ${ONLINE_VARIANTS:+--online-variants "$ONLINE_VARIANTS"} --warmup-requests 8 \
    --warmup-modes dvr@50 ${ONLINE_LOAD:+--online-load "$ONLINE_LOAD"} --online-modes nondet,dvr@50 \
    --online-requests "${ONLINE_REQUESTS:-500}" --online-budget-s "${ONLINE_BUDGET:-330}" \
    --online-repeats "${ONLINE_REPEATS:-2}" --out "$OUT/dvr_ab_smollm2_${ROUND}_$TAG.json" >"$OUT/dvr_ab_$TAG.txt" 2>&1
log "dvr_ab exit $?"
grep -E "^\[dvr_ab\]|rror|identical" "$OUT/dvr_ab_$TAG.txt" | grep -v warm-up | grep -E "tok/s|median|ITL p50|deterministic ITL|identical|rror|online" | cut -c1-300 | tail -n 70
log "done"
