#!/usr/bin/env bash
# Round 49, device call A (carry .dev_stage/a: it stages the SmolLM2 GGUF's first half for r49_call_b.sh right
# after it). First the 8B decode step whole against the same step as two halves with one half's attention beside
# the other half's GEMMs (decode_overlap_ab.py: CUDA graphs replayed in turn, the bits against the halves alone),
# then the 8B shape's nondet run (1,000 requests, 1,024 sequences, admission by budget) four ways in one process,
# ABBA: the tree's step, the overlapped decode (FastPolicy(overlap_decode=True)), the K/V store at 0.85 of the
# free memory instead of 0.6 (round 47: decode batches of 256-354 rows at 1,024 seats on an H100, bound by the
# store), and round 48's longest-first head-major decode attention order.
#
#   bash benchmarks/device/r49_call_a.sh
source "$(dirname "$0")/stage_a.sh"
timeout "${OVERLAP_CAP:-100}" python3 benchmarks/device/decode_overlap_ab.py --out "$OUT/decode_overlap_ab.json" \
    --reps "${REPS:-30}" >"$OUT/decode_overlap_ab.txt" 2>&1
log "overlap a/b exit $?"; cut -c1-600 "$OUT/decode_overlap_ab.txt" | grep -v Warn | tail -n 6
timeout "${AB_CAP:-420}" python3 benchmarks/device/dvr_ab.py --model 8b \
    --variants "${AB_VARIANTS:-admit_budget,admit_budget_overlap,admit_budget_kv_0.85,admit_budget_order_head_longest}" \
    --modes nondet --repeats "${REPEATS:-2}" --lm-head-std 0.2 --lm-head-bias-scale 26.9 --max-num-seqs 1024 \
    --budget-s "${BUDGET:-340}" --warmup-requests 8 --out "$OUT/ab_8b.json" >"$OUT/ab_8b.txt" 2>&1
log "8b a/b exit $?"; grep -v Warn "$OUT/ab_8b.txt" | cut -c1-400 | tail -n 12
log "done"
