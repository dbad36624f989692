#!/usr/bin/env bash
# Round 9, device call D (issue 10), right after a call that copied .dev_stage/a/part_a to /root (it carries
# .dev_stage/b): benchmarks/device/dvr_ab.py on the real SmolLM2-135M-Instruct, 1,000 chat requests offline at
# max_num_seqs 1,024, nondet / dvr@10 / dvr@50 for round 8's default (narrow passes on the caller's stream) and
# the round-9 CUDA default (wide verify passes on their own stream), in one process.
#
#   bash benchmarks/device/r9_call_d.sh [BUDGET_S]       (OUT=... as the device tool sets it)
source "$(dirname "$0")/session_preamble.sh"
BUDGET=${1:-300}
source "$(dirname "$0")/smollm2_env.sh"
timeout $((BUDGET + 100)) python3 benchmarks/device/dvr_ab.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --variants round8,default --budget-s "$BUDGET" --out "$OUT/dvr_ab_round9_default.json" >>"$LOG" 2>&1
log "dvr_ab exit $?"
grep "^\[dvr_ab\]\|num_checked" "$LOG" | tail -n 16
log "done"
