#!/usr/bin/env bash
# One device call (issue 10, round 8): benchmarks/device/dvr_ab.py on SmolLM2-135M-Instruct (real weights),
# 1,000 chat requests offline at max_num_seqs 1,024: nondet, dvr@10 and dvr@50 for the engine's default
# (drafting ahead), with wide verify passes as well, and as in round 7 (neither), in one process. (Round 8's calls
# 5 and 7 ran it when wide verify was on by default, under the variant names new / no_wide_verify / round7.)
# Run it right after a call that copied .dev_stage/a/part_a to /root, carrying .dev_stage/b.
#
#   bash benchmarks/device/dvr_ab_session.sh [BUDGET_S]       (OUT=... as the device tool sets it)
source "$(dirname "$0")/session_preamble.sh"
BUDGET=${1:-400}
source "$(dirname "$0")/smollm2_env.sh"
timeout $((BUDGET + 120)) python3 benchmarks/device/dvr_ab.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --budget-s "$BUDGET" --out "$OUT/dvr_ab_smollm2.json" >>"$LOG" 2>&1
log "dvr_ab exit $?"
grep "^\[dvr_ab\]\|num_checked" "$LOG" | tail -n 24
log "done"
