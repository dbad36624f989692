#!/usr/bin/env bash
# One device call: wide canonical passes on the H200 (issue 12), then the 8B serving benchmark (issue 10).
#
#   bash benchmarks/device/wide_pass_session.sh [SERVING_BUDGET_S]      (OUT=... as the device tool sets it)
#
# 1. GPU tests: the wide pass's bits against R-row passes with cuBLAS, the engine's needle tests, the
#    prefill-vs-canonical tolerance test and the RL tests (LLM42_GPU_TEST_LAYERS=8);
# 2. long_prompts (8B shape, 8,192 and 15,000 tokens, max_fast_tokens 2,048) side by side with
#    max_canonical_tokens 256 (R: narrow passes, the earlier engine), 1,024 and the default (2,048);
# 3. with SERVING_BUDGET_S > 0, benchmarks/serving.py on the 8B shape, 1,000 requests at most.
# Copies .dev_stage/a/part_a to /root when it was carried (the SmolLM2 stage for the next call).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/llm42_out}
mkdir -p "$OUT"
LOG="$OUT/session_log.txt"
SERVING_BUDGET=${1:-0}  # 0: no serving run
export PYTHONUNBUFFERED=1 PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
START=$(date +%s)
log() { echo "[+$(( $(date +%s) - START ))s] $*" | tee -a "$LOG"; }
[ -f .dev_stage/a/part_a ] && cp .dev_stage/a/part_a /root/smollm2.part_a && log "part_a copied to /root"
LLM42_GPU_TEST_LAYERS=8 timeout 170 python3 -m pytest -v -p no:cacheprovider -m gpu --durations=10 \
    tests/gpu/test_wide_pass_cuda.py \
    "tests/gpu/test_tiled_attention.py::test_fast_policy_prefill_matches_the_canonical_pass_within_rounding" \
    tests/gpu/test_engine_cuda.py tests/gpu/test_rl_cuda.py >"$OUT/gpu_tests.txt" 2>&1
log "tests exit $?"
tail -n 4 "$OUT/gpu_tests.txt" >>"$LOG"
for w in 256 1024 2048; do
    timeout 100 python3 -m llm42.bench.long_prompts --device cuda --model 8b --lengths 8192,15000 --reps 1 \
        --max-canonical-tokens "$w" --budget-s 85 --no-plots --out "$OUT/long_prompts_w$w.json" >>"$LOG" 2>&1
    log "long_prompts W=$w exit $?"
done
(( SERVING_BUDGET > 0 )) && timeout $((SERVING_BUDGET + 25)) python3 benchmarks/serving.py --device cuda --model 8b --budget-s "$SERVING_BUDGET" \
    --no-plots --no-hf --max-fast-tokens 2048 --modes nondet,dvr@10,dvr@50,batch_invariant \
    --online-modes nondet,dvr@50 --online-loads 0.7 --out "$OUT/serving_cuda_8b.json" >>"$LOG" 2>&1
log "serving 8b exit $?"
log "done"
