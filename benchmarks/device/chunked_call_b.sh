#!/usr/bin/env bash
# For the next device session (issue 10), call B, right after chunked_call_a.sh (it carries .dev_stage/b): real
# SmolLM2, 1,000 chat requests offline at max_num_seqs 1,024, nondet / dvr@10 / dvr@50: the default (split rows,
# tiled canonical attention) against the chunked canonical attention with split rows and with deterministic rows
# on its bits (their chunks in parallel), in one process. Written in round 11, not yet run.
#
#   bash benchmarks/device/chunked_call_b.sh [BUDGET_S]
source "$(dirname "$0")/session_preamble.sh"
BUDGET=${1:-300}
source "$(dirname "$0")/smollm2_env.sh"
timeout $((BUDGET + 100)) python3 benchmarks/device/dvr_ab.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --variants split_rows,chunked,chunked_det_rows --budget-s "$BUDGET" --out "$OUT/dvr_ab_smollm2_chunked.json" \
    >>"$LOG" 2>&1
log "dvr_ab exit $?"
grep "^\[dvr_ab\]\|num_checked" "$LOG" | tail -n 24
log "done"
