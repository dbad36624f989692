#!/usr/bin/env bash
# Round 37, device call B (carry .dev_stage/b, at once after a call that carried .dev_stage/a, e.g.
# r36_call_c.sh): free requests' online ITL with tokens handed over before each step's canonical phase
# (DVRGenerator.step(deliver=...), which the online runs now use), from the same runs also as a caller taking them
# at step() return saw them (the clock before round 37: free_itl_at_return_*); default against pass_before_read
# (the pass's launch under the read's wait: with the hand-over ahead of the canonical phase, what is left after the
# read is applying) and priority (prioritize_fast). Real SmolLM2: offline nondet and dvr@50, then online at 0.7
# load, 500 requests, nondet and dvr@50, twice in ABBA order, every step's phases timed.
#
#   bash benchmarks/device/r37_call_b.sh
source "$(dirname "$0")/session_preamble.sh"
source "$(dirname "$0")/smollm2_env.sh"
timeout "${CAP:-560}" python3 benchmarks/device/dvr_ab.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --variants "${VARIANTS:-default,pass_before_read,priority}" --modes "${MODES:-nondet,dvr@50}" --budget-s 90 \
    --warmup-requests 8 --warmup-modes dvr@50 --online-load 0.7 --online-modes nondet,dvr@50 \
    --online-requests "${ONLINE_REQUESTS:-500}" --online-budget-s "${ONLINE_BUDGET:-330}" \
    --online-repeats "${ONLINE_REPEATS:-2}" --out "$OUT/dvr_ab_smollm2_r37_b.json" >"$OUT/dvr_ab_b.txt" 2>&1
log "dvr_ab exit $?"
grep -E "^\[dvr_ab\]|rror|identical" "$OUT/dvr_ab_b.txt" | grep -v warm-up | tail -n 80
log "done"
