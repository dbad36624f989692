#!/usr/bin/env bash
# One device call (issue 10, round 8): benchmarks/serving.py on SmolLM2-135M-Instruct (real weights) at
# max_num_seqs 1,024, with deterministic requests drafting ahead of their windows (the default: offline nondet,
# dvr@10, dvr@50; online nondet and dvr@50 at 0.7 of capacity), then the same offline modes without
# (--no-draft-ahead): the A/B of drafting ahead, each run with its own nondet for the ratios.
# Run it right after a call that copied .dev_stage/a/part_a to /root, carrying .dev_stage/b.
#
#   bash benchmarks/device/draft_ahead_session.sh [BUDGET_S]       (OUT=... as the device tool sets it)
source "$(dirname "$0")/session_preamble.sh"
BUDGET=${1:-230}
source "$(dirname "$0")/smollm2_env.sh"
timeout $((BUDGET + 80)) python3 benchmarks/serving.py --device cuda --model "$SMOL" --cache-dir /tmp/llm42_models \
    --budget-s "$BUDGET" --no-plots --no-hf --max-fast-tokens 2048 --max-num-seqs 1024 \
    --modes nondet,dvr@10,dvr@50 --online-modes nondet,dvr@50 --online-loads 0.7 \
    --out "$OUT/serving_smollm2_draft_ahead.json" >>"$LOG" 2>&1
log "serving SmolLM2, drafting ahead, exit $?"
timeout 200 python3 benchmarks/serving.py --device cuda --model "$SMOL" --cache-dir /tmp/llm42_models \
    --budget-s 120 --no-plots --no-hf --max-fast-tokens 2048 --max-num-seqs 1024 --no-draft-ahead \
    --modes nondet,dvr@10,dvr@50 --online-modes "" \
    --out "$OUT/serving_smollm2_no_draft_ahead.json" >>"$LOG" 2>&1
log "serving SmolLM2, not drafting ahead, exit $?"
log "done"
