#!/usr/bin/env bash
# Round 11, device call B (issue 10), right after a call that copied .dev_stage/a/part_a to /root (it carries
# .dev_stage/b): the real SmolLM2-135M-Instruct, 1,000 chat requests offline at max_num_seqs 1,024, nondet /
# dvr@10 / dvr@50, the new default fast path (deterministic rows with the canonical attention's bits) against
# round 10's (split_rows), then 500 of them online at 0.7 x capacity (nondet, dvr@50), in one process; then, in a
# second process, the defaults with adaptive_draft (offline) while the time lasts.
#
#   bash benchmarks/device/r11_call_b.sh [BUDGET_S] [ONLINE_S] [ADAPTIVE_S (0: none)] [NAME]
# (call E ran it again, after call D, as: bash benchmarks/device/r11_call_b.sh 200 80 0 dvr_ab_smollm2_side_stream)
source "$(dirname "$0")/session_preamble.sh"
BUDGET=${1:-240}
ONLINE=${2:-90}
ADAPTIVE=${3:-100}
NAME=${4:-dvr_ab_smollm2}
source "$(dirname "$0")/smollm2_env.sh"
timeout $((BUDGET + ONLINE + 100)) python3 benchmarks/device/dvr_ab.py --model "$SMOL" \
    --cache-dir /tmp/llm42_models --variants default,split_rows --budget-s "$BUDGET" --online-load 0.7 \
    --online-budget-s "$ONLINE" --out "$OUT/$NAME.json" >>"$LOG" 2>&1
log "dvr_ab exit $?"
[ "$ADAPTIVE" -gt 0 ] && timeout $((ADAPTIVE + 40)) python3 benchmarks/device/dvr_ab.py --model "$SMOL" \
    --cache-dir /tmp/llm42_models --variants adaptive --budget-s "$ADAPTIVE" \
    --out "$OUT/dvr_ab_smollm2_adaptive.json" >>"$LOG" 2>&1
[ "$ADAPTIVE" -gt 0 ] && log "dvr_ab adaptive exit $?"
grep "^\[dvr_ab\]\|num_checked" "$LOG" | tail -n 30
log "done"
