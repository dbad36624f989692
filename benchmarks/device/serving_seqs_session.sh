#!/usr/bin/env bash
# One device call (issue 10): benchmarks/serving.py on SmolLM2-135M-Instruct (real weights) with mixed fast
# steps (the default), at max_num_seqs 1,024 (offline nondet, dvr@10, dvr@50; online nondet and dvr@50 at
# 0.7 of capacity), then offline nondet alone at max_num_seqs 256 (the same requests, for the ratio).
# Run it right after a call that copied .dev_stage/a/part_a to /root, carrying .dev_stage/b.
#
#   bash benchmarks/device/serving_seqs_session.sh [BUDGET_S]       (OUT=... as the device tool sets it)
source "$(dirname "$0")/session_preamble.sh"
BUDGET=${1:-280}
source "$(dirname "$0")/smollm2_env.sh"
timeout $((BUDGET + 80)) python3 benchmarks/serving.py --device cuda --model "$SMOL" --cache-dir /tmp/llm42_models \
    --budget-s "$BUDGET" --no-plots --no-hf --max-fast-tokens 2048 --max-num-seqs 1024 \
    --modes nondet,dvr@10,dvr@50 --online-modes nondet,dvr@50 --online-loads 0.7 \
    --out "$OUT/serving_smollm2_seqs1024.json" >>"$LOG" 2>&1
log "serving SmolLM2 max_num_seqs 1024 exit $?"
timeout 150 python3 benchmarks/serving.py --device cuda --model "$SMOL" --cache-dir /tmp/llm42_models \
    --budget-s 70 --no-plots --no-hf --max-fast-tokens 2048 --max-num-seqs 256 --modes nondet --online-modes "" \
    --out "$OUT/serving_smollm2_seqs256.json" >>"$LOG" 2>&1
log "serving SmolLM2 max_num_seqs 256 exit $?"
log "done"
