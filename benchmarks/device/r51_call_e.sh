#!/usr/bin/env bash
# Round 51, device call E (carry .dev_stage/b, at once after two staging calls: stage_a.sh carrying .dev_stage/a with
# RUN_TESTS=1 and GPU_TESTS as r51_call_d.sh sets them, then stage_a.sh carrying .dev_stage/m). Real SmolLM2 offline
# (1,000 chat requests, nondet and dvr@50) under the new default, the lean Gumbel sweep, against the sweep before it
# ("gumbel_plain"), REPEATS times in ABBA order in one process, committed outputs compared: call B's one run each
# gave dvr@50 0.807 with the lean sweep against 0.864 (identical outputs, 386 against 308 passes), which this checks.
#
#   [REPEATS=3] bash benchmarks/device/r51_call_e.sh
source "$(dirname "$0")/session_preamble.sh"
source "$(dirname "$0")/smollm2_env.sh"
timeout "${CAP:-230}" python3 benchmarks/device/dvr_ab.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --variants default,gumbel_plain --modes nondet,dvr@50 --repeats "${REPEATS:-3}" --budget-s 60 \
    --warmup-requests 8 --warmup-modes dvr@50 --out "$OUT/dvr_ab_smollm2_r51_e.json" >"$OUT/dvr_ab_e.txt" 2>&1
log "dvr_ab exit $?"
grep -E "tok/s|median|identical|rror" "$OUT/dvr_ab_e.txt" | grep -v warm-up | cut -c1-220 | tail -n 20
log "done"
