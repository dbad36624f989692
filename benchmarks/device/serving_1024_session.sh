#!/usr/bin/env bash
# One device call (issue 10): benchmarks/serving.py on SmolLM2-135M-Instruct (real weights), mixed fast steps
# with power-of-two decode buckets, max_num_seqs 1,024: offline nondet, dvr@10 and dvr@50 (no online phase).
# Run it right after a call that copied .dev_stage/a/part_a to /root, carrying .dev_stage/b.
#
#   bash benchmarks/device/serving_1024_session.sh [BUDGET_S]       (OUT=... as the device tool sets it)
source "$(dirname "$0")/session_preamble.sh"
BUDGET=${1:-150}
if ! ls /root/smollm2/*.gguf >/dev/null 2>&1 && [ -f /root/smollm2.part_a ] && [ -d .dev_stage/b ]; then
    bash benchmarks/device/join_smollm2.sh >>"$LOG" 2>&1 || log "join_smollm2.sh failed"
fi
export PYTHONPATH="src:/tmp/site"
SMOL=$(ls /root/smollm2/*.gguf 2>/dev/null | head -n 1)
[ -n "$SMOL" ] || { log "no SmolLM2 GGUF: stopping"; exit 1; }
timeout $((BUDGET + 60)) python3 benchmarks/serving.py --device cuda --model "$SMOL" --cache-dir /tmp/llm42_models \
    --budget-s "$BUDGET" --no-plots --no-hf --max-fast-tokens 2048 --max-num-seqs 1024 \
    --modes nondet,dvr@10,dvr@50 --online-modes "" --out "$OUT/serving_smollm2_seqs1024_pow2.json" >>"$LOG" 2>&1
log "serving SmolLM2 max_num_seqs 1024 exit $?"
log "done"
