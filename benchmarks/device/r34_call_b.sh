#!/usr/bin/env bash
# Round 34, device call B (carry .dev_stage/b, at once after a call that carried .dev_stage/a, e.g.
# `CAP=100 bash benchmarks/device/r33_call_t.sh`): the online ITL target's diagnosis. Real SmolLM2, Poisson at 0.7 x
# capacity, 500 requests, nondet and dvr@50, the default against `gc_freeze` (the timed run inside frozen_gc, as
# `llm42 serve` serves; dvr_ab's runs are not frozen unless asked, and no online run has been). Round 33 (H100): free
# ITL p50 / p99 at 1.25x / 2.16x nondet's. Every online run now writes `free_gaps`: each free gap by what the steps
# it spans did (launched a canonical pass, applied one, both, neither) and the collector's time in them.
#
#   bash benchmarks/device/r34_call_b.sh
source "$(dirname "$0")/session_preamble.sh"
source "$(dirname "$0")/smollm2_env.sh"
timeout "${CAP:-400}" python3 benchmarks/device/dvr_ab.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --variants "${VARIANTS:-default,gc_freeze}" --modes nondet --budget-s 60 --warmup-requests 8 \
    --warmup-modes dvr@50 --online-load 0.7 --online-modes nondet,dvr@50 --online-requests 500 \
    --online-budget-s 160 --out "$OUT/dvr_ab_smollm2_r34_b_online.json" >"$OUT/dvr_ab_online.txt" 2>&1
log "dvr_ab online exit $?"
grep -E "^\[dvr_ab\]|rror" "$OUT/dvr_ab_online.txt" | grep -v warm-up | tail -n 30
log "done"
