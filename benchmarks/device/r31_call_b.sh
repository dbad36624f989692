#!/usr/bin/env bash
# Round 31, device call B (carries .dev_stage/b, at once after r31_call_a.sh, which copied the GGUF's first half to
# /root): round 30's call B cut to what the session's device time left allows (its failed starts cost ~100 s
# each). The levers for SmolLM2's dvr@50 (0.67-0.75 of nondet in rounds 23-25; the target is 0.80) beside the
# default, in one process, ABBA (--repeats 2: the variants' order reversed on the second repeat):
# - gemm_rows_1024: FixedShapePolicy(gemm_rows=1024), every canonical GEMM at M = 1,024 (its own canonical config;
#   dvr_ab.py checks each variant's deterministic outputs across its repeats);
# - order_budget: DefaultScheduler(order="budget") (the default's canonical config: identical outputs).
# The real SmolLM2, 1,000 chat requests, nondet and dvr@50. The JSON is rewritten after every run.
#
#   bash benchmarks/device/r31_call_b.sh
source "$(dirname "$0")/session_preamble.sh"
source "$(dirname "$0")/smollm2_env.sh"
timeout "${CAP:-460}" python3 benchmarks/device/dvr_ab.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --variants "${VARIANTS:-default,gemm_rows_1024,order_budget}" --modes nondet,dvr@50 --repeats 2 \
    --budget-s "${BUDGET:-120}" \
    --warmup-requests 8 --warmup-modes dvr@50 --out "$OUT/levers_b.json" >"$OUT/levers_b.txt" 2>&1
log "dvr_ab exit $?"
grep -E "^\[dvr_ab\]|^\{" "$OUT/levers_b.txt" | grep -v warm-up | tail -n 40
log "done"
