#!/usr/bin/env bash
# Round 49, device call A (carry .dev_stage/a: it stages the SmolLM2 GGUF's first half for r48_call_b.sh right
# after it). Round 48's call A, trimmed, plus the K/V store's share of the free memory: the GPU order test, the
# decode attention launch sweep (orders x block / warps), then the 8B shape's nondet run (1,000 requests, 1,024
# sequences, admission by budget) three ways in one process, ABBA: the tree's launch (order off), the longest-first
# head-major order, and the K/V store at 0.85 of the free memory instead of 0.6 (round 47: decode batches of 256-354
# rows at 1,024 seats on an H100, bound by the store).
#
#   bash benchmarks/device/r49_call_a.sh
export RUN_TESTS=1 TEST_CAP=${TEST_CAP:-60}
export GPU_TESTS="tests/gpu/test_tiled_attention.py::test_decode_program_order_keeps_the_bits"
source "$(dirname "$0")/stage_a.sh"
timeout "${SWEEP_CAP:-70}" python3 benchmarks/device/decode_attention_sweep.py --out "$OUT/decode_attention_sweep.json" \
    --reps "${REPS:-15}" ${SWEEP_ARGS:---block-n 64 --warps 4,8 --stages 3} >"$OUT/decode_attention_sweep.txt" 2>&1
log "sweep exit $?"; grep '"by_order"' "$OUT/decode_attention_sweep.txt" | cut -c1-400
timeout "${AB_CAP:-330}" python3 benchmarks/device/dvr_ab.py --model 8b \
    --variants "${AB_VARIANTS:-admit_budget,admit_budget_order_head_longest,admit_budget_kv_0.85}" \
    --modes nondet --repeats "${REPEATS:-2}" --lm-head-std 0.2 --lm-head-bias-scale 26.9 --max-num-seqs 1024 \
    --budget-s "${BUDGET:-255}" --warmup-requests 8 --out "$OUT/ab_8b.json" >"$OUT/ab_8b.txt" 2>&1
log "8b a/b exit $?"; grep -v Warn "$OUT/ab_8b.txt" | cut -c1-400 | tail -n 10
log "done"
