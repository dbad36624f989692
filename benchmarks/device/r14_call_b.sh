#!/usr/bin/env bash
# Round 14, device calls B and C, right after r14_call_a.sh (carry .dev_stage/b): real SmolLM2, 1,000 chat
# requests offline at max_num_seqs 1,024, nondet / dvr@10 / dvr@50, then online (Poisson, 0.7 x capacity, 500
# requests, nondet and dvr@50): the default (tiled canonical attention, split kernel for every decode row) against
# chunked_det_rows (FixedShapePolicy(attention_kernel="chunked") with the deterministic requests' decode rows on its
# bits, each row's 512-key chunks in parallel: other committed bits). One process per call; call B runs the
# variants in one order, call C in the other (ORDER=2); the two JSONs' digests are compared afterwards
# (dvr_ab.py --compare).
#
#   bash benchmarks/device/r14_call_b.sh [BUDGET_S] [ORDER]
source "$(dirname "$0")/session_preamble.sh"
BUDGET=${1:-150}
ORDER=${2:-1}
source "$(dirname "$0")/smollm2_env.sh"
variants=split_rows,chunked_det_rows
[ "$ORDER" = 2 ] && variants=chunked_det_rows,split_rows
timeout $((BUDGET + 300)) python3 benchmarks/device/dvr_ab.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --variants "$variants" --budget-s "$BUDGET" --warmup-requests 16 \
    --online-load 0.7 --online-modes nondet,dvr@50 --online-requests 500 --online-budget-s 60 \
    --out "$OUT/dvr_ab_smollm2_r14_p$ORDER.json" >>"$LOG" 2>&1
log "dvr_ab ($variants) exit $?"
grep "^\[dvr_ab\]" "$LOG" | grep -v warm-up | tail -n 30
log "done"
