#!/usr/bin/env bash
# Round 12, device call B, right after r12_call_a.sh (carry .dev_stage/b): real SmolLM2, 1,000 chat requests
# offline at max_num_seqs 1,024, nondet / dvr@10 / dvr@50, in one process: the default (split rows, tiled canonical
# attention, window 32) against DefaultScheduler(prompt_share=0.5), window 16 (R 16 x 16) alone and with the share,
# and the chunked canonical attention with deterministic rows on its bits.
#
#   bash benchmarks/device/r12_call_b.sh [BUDGET_S] [VARIANTS] [NAME]
source "$(dirname "$0")/session_preamble.sh"
BUDGET=${1:-420}
VARIANTS=${2:-split_rows,prompt_share,w16,w16_share,chunked_det_rows}
NAME=${3:-dvr_ab_smollm2_r12}
source "$(dirname "$0")/smollm2_env.sh"
timeout $((BUDGET + 120)) python3 benchmarks/device/dvr_ab.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --variants "$VARIANTS" --budget-s "$BUDGET" --out "$OUT/$NAME.json" >>"$LOG" 2>&1
log "dvr_ab exit $?"
grep "^\[dvr_ab\]\|num_checked" "$LOG" | tail -n 40
log "done"
