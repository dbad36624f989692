#!/usr/bin/env bash
# Round 9, device call B (issue 10), right after call A (it carries .dev_stage/b): benchmarks/device/dvr_ab.py on
# the real SmolLM2-135M-Instruct, 1,000 chat requests offline at max_num_seqs 1,024, nondet / dvr@10 / dvr@50 for
# the default (drafting ahead, passes on the caller's stream), side_stream (canonical_stream=True) and
# side_stream_wide (that and wide verify passes), in one process; then online at 0.7 of capacity, nondet and
# dvr@50 with the passes on their own stream (free requests' ITL).
#
#   bash benchmarks/device/r9_call_b.sh [AB_BUDGET_S] [ONLINE_BUDGET_S]       (OUT=... as the device tool sets it)
source "$(dirname "$0")/session_preamble.sh"
AB=${1:-300}
ONLINE=${2:-100}
source "$(dirname "$0")/smollm2_env.sh"
timeout $((AB + 100)) python3 benchmarks/device/dvr_ab.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --variants default,side_stream,side_stream_wide --budget-s "$AB" --out "$OUT/dvr_ab_side_stream.json" >>"$LOG" 2>&1
log "dvr_ab exit $?"
grep "^\[dvr_ab\]\|num_checked" "$LOG" | tail -n 24
timeout $((ONLINE + 60)) python3 benchmarks/serving.py --device cuda --model "$SMOL" --cache-dir /tmp/llm42_models \
    --budget-s "$ONLINE" --no-plots --no-hf --max-fast-tokens 2048 --max-num-seqs 1024 --canonical-stream \
    --modes nondet --online-modes nondet,dvr@50 --online-loads 0.7 \
    --out "$OUT/serving_smollm2_online_side_stream.json" >>"$LOG" 2>&1
log "serving online side stream exit $?"
log "done"
