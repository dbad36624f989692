#!/usr/bin/env bash
# Round 48, device call A (carry .dev_stage/a: it stages the SmolLM2 GGUF's first half for the call after it): the fast
# decode attention's program order (a sequence's kv heads adjacent, the longest contexts first; the same bits in any
# order). First the GPU tests (the order test at model shapes; the engine and pass-order contract tests, whose decode
# graphs now capture the step's sort), then the launch sweep (block / warps / stages x order, K/V TB/s, bits), then
# the 8B shape's nondet run (1,000 requests, 1,024 sequences, admission by budget) with the order and without it,
# ABBA, in one process.
#
#   bash benchmarks/device/r48_call_a.sh
export RUN_TESTS=1 TEST_CAP=${TEST_CAP:-150}
export GPU_TESTS="tests/gpu/test_tiled_attention.py::test_decode_program_order_keeps_the_bits tests/gpu/test_engine_cuda.py \
tests/gpu/test_pass_order_cuda.py"
source "$(dirname "$0")/stage_a.sh"
timeout "${SWEEP_CAP:-100}" python3 benchmarks/device/decode_attention_sweep.py --out "$OUT/decode_attention_sweep.json" \
    --reps "${REPS:-15}" ${SWEEP_ARGS:---block-n 64,128 --warps 4,8 --stages 3} >"$OUT/decode_attention_sweep.txt" 2>&1
log "sweep exit $?"; grep '"by_order"' "$OUT/decode_attention_sweep.txt" | cut -c1-400
timeout "${AB_CAP:-200}" python3 benchmarks/device/dvr_ab.py --model 8b --variants admit_budget_order_head_longest,admit_budget_order_seq \
    --modes nondet --repeats "${REPEATS:-2}" --lm-head-std 0.2 --lm-head-bias-scale 26.9 --max-num-seqs 1024 \
    --budget-s "${BUDGET:-170}" --warmup-requests 8 --out "$OUT/order_ab_8b.json" >"$OUT/order_ab_8b.txt" 2>&1
log "8b order a/b exit $?"; grep -v Warn "$OUT/order_ab_8b.txt" | cut -c1-400 | tail -n 8
log "done"
