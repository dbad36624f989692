#!/usr/bin/env bash
# Round 41, device call C (carry .dev_stage/b and .dev_stage/base, at once after a call that carried .dev_stage/a):
# the packed staging (one pinned buffer, one copy per canonical pass and per fast prompt step) against the tree
# before it, in separate processes on one machine, in ABBA order: real SmolLM2, the default engine, offline nondet
# (the capacity), then online nondet and dvr@50 at 0.7 load, 500 requests; each process's free ITL over its own
# nondet, and the pass steps' host phases. .dev_stage/base: `git archive <base> src` (round 41: 663dbc2).
#
#   bash benchmarks/device/r41_call_c.sh
source "$(dirname "$0")/session_preamble.sh"
source "$(dirname "$0")/smollm2_env.sh"
run() {  # $1: tag, $2: the tree (its dvr_ab.py puts its own src first on the path)
    timeout "${CAP:-150}" python3 "$2/benchmarks/device/dvr_ab.py" --model "$SMOL" \
        --cache-dir /tmp/llm42_models --variants default --modes nondet --budget-s 40 --warmup-requests 4 \
        --warmup-modes dvr@50 --online-load 0.7 --online-modes nondet,dvr@50 --online-requests 500 \
        --online-budget-s 40 --out "$OUT/dvr_ab_$1.json" >"$OUT/dvr_ab_$1.txt" 2>&1
    log "$1 exit $?"
    grep -E "free ITL p50|launch_and_apply steps|launch steps|tok/s" "$OUT/dvr_ab_$1.txt" | cut -c1-400
}
# the base tree travels as its src alone (the call's 64 MiB); its benchmark scripts are this tree's (dvr_ab.py and
# what it imports did not change since 663dbc2)
mkdir -p .dev_stage/base/benchmarks && cp -r benchmarks/device .dev_stage/base/benchmarks/ && cp benchmarks/*.py .dev_stage/base/benchmarks/
run base1 .dev_stage/base
run packed1 .
run packed2 .
run base2 .dev_stage/base
log "done"
