#!/usr/bin/env bash
# Round 41, device call B (carry .dev_stage/b, at once after a call that carried .dev_stage/a): where a pass's host
# time goes in an online run, with round 41's finer phases (llm42.bench.runner.PHASES: the verifier's launch, the
# static rows' staging, the sampling rows, the graph replays, the decode state's flush). Real SmolLM2, the default
# engine: offline nondet (1,000 chat requests: the capacity), then online nondet and dvr@50 at 0.7 load, 500 requests.
#
#   bash benchmarks/device/r41_call_b.sh
source "$(dirname "$0")/session_preamble.sh"
source "$(dirname "$0")/smollm2_env.sh"
timeout "${CAP:-200}" python3 benchmarks/device/dvr_ab.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --variants "${VARIANTS:-default}" --modes nondet --budget-s 40 --warmup-requests 4 --warmup-modes dvr@50 \
    --online-load 0.7 --online-modes nondet,dvr@50 --online-requests 500 --online-budget-s 40 \
    --out "$OUT/dvr_ab_smollm2_r41_b.json" >"$OUT/dvr_ab_b.txt" 2>&1
log "dvr_ab exit $?"
grep -E "^\[dvr_ab\]" "$OUT/dvr_ab_b.txt" | tail -n 30
log "done"
