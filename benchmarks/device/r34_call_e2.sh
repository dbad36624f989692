#!/usr/bin/env bash
# Round 34, device call E2 (carry .dev_stage/b, at once after r34_call_e1.sh): the online ITL target, the default
# against `pass_before_read` (DVRGenerator(pass_before_read=True): the pass is launched before the previous fast
# step is read back). Round 34's call D timed every step's phases: plain steps waited 1.2 of 1.7 ms in that read,
# and the pass's launch (1.06 ms, 0.64 of it staging) came after it. Real SmolLM2, offline nondet (the capacity),
# then online Poisson at 0.7 x capacity, 500 requests, nondet and dvr@50, phases timed.
#
#   bash benchmarks/device/r34_call_e2.sh
source "$(dirname "$0")/session_preamble.sh"
source "$(dirname "$0")/smollm2_env.sh"
timeout "${CAP:-200}" python3 benchmarks/device/dvr_ab.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --variants "${VARIANTS:-default,pass_before_read}" --modes nondet --budget-s 40 --warmup-requests 8 \
    --warmup-modes dvr@50 --online-load 0.7 --online-modes nondet,dvr@50 --online-requests 500 \
    --online-budget-s 140 --out "$OUT/dvr_ab_smollm2_r34_e2.json" >"$OUT/dvr_ab_e2.txt" 2>&1
log "dvr_ab exit $?"
grep -E "^\[dvr_ab\]|rror" "$OUT/dvr_ab_e2.txt" | grep -v warm-up | tail -n 40
log "done"
