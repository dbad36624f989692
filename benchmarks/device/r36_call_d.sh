#!/usr/bin/env bash
# Round 36, device call D (carry .dev_stage/b, at once after r36_call_c.sh, which carried .dev_stage/a): the online ITL
# target against DVRGenerator(prioritize_fast=True) (dvr_ab's "priority": each step's own work on a stream of the
# device's highest priority, the canonical pass's stream at the lowest). Calls A and C timed a decode step beside a
# pass on two streams, without and with those priorities (profile_passes.py --beside). Real SmolLM2: offline nondet
# and dvr@50, then online at 0.7 load, 500 requests, nondet and dvr@50, twice in ABBA order, every step's phases timed
# (the same as r35_call_b.sh, which call B ran with VARIANTS=default,narrow_passes).
#
#   bash benchmarks/device/r36_call_d.sh
source "$(dirname "$0")/session_preamble.sh"
source "$(dirname "$0")/smollm2_env.sh"
timeout "${CAP:-540}" python3 benchmarks/device/dvr_ab.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --variants "${VARIANTS:-default,priority}" --modes "${MODES:-nondet,dvr@50}" --budget-s 100 \
    --warmup-requests 8 --warmup-modes dvr@50 --online-load 0.7 --online-modes nondet,dvr@50 \
    --online-requests 500 --online-budget-s 240 --online-repeats "${ONLINE_REPEATS:-2}" \
    --out "$OUT/dvr_ab_smollm2_r36_d.json" >"$OUT/dvr_ab_d.txt" 2>&1
log "dvr_ab exit $?"
grep -E "^\[dvr_ab\]|rror|identical" "$OUT/dvr_ab_d.txt" | grep -v warm-up | tail -n 60
log "done"
