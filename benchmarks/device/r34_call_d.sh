#!/usr/bin/env bash
# Round 34, device call D (carry .dev_stage/b, at once after a call that carried .dev_stage/a): the online ITL
# target, the default against `split_pass_steps` (DVRGenerator(split_pass_steps=True): a step that applies a pass's
# commits launches none; the next step does). Round 34's call B: the slowest 1 % of free gaps all spanned steps
# that both applied a pass and launched the next (step() 4.27 ms p50 against 1.46 ms for plain steps). Real
# SmolLM2; offline nondet and dvr@50 (1,000 requests: the capacity, and deterministic outputs compared across the
# variants), then online Poisson at 0.7 x capacity, 500 requests, nondet and dvr@50, every step's engine phases
# timed (free_gaps.steps.*.phases_mean_ms).
#
#   bash benchmarks/device/r34_call_d.sh
source "$(dirname "$0")/session_preamble.sh"
source "$(dirname "$0")/smollm2_env.sh"
timeout "${CAP:-330}" python3 benchmarks/device/dvr_ab.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --variants "${VARIANTS:-default,split_pass_steps}" --modes nondet,dvr@50 --budget-s 80 --warmup-requests 8 \
    --warmup-modes dvr@50 --online-load 0.7 --online-modes nondet,dvr@50 --online-requests 500 \
    --online-budget-s 160 --out "$OUT/dvr_ab_smollm2_r34_d.json" >"$OUT/dvr_ab_d.txt" 2>&1
log "dvr_ab exit $?"
grep -E "^\[dvr_ab\]|rror|identical" "$OUT/dvr_ab_d.txt" | grep -v warm-up | tail -n 40
log "done"
