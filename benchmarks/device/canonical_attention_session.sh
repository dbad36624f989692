#!/usr/bin/env bash
# One device call (after stage_smollm2.py's call 1): which canonical attention kernel a chat workload should run,
# measured side by side, then the GPU tests the last call did not reach.
#
#   bash benchmarks/device/canonical_attention_session.sh [TOTAL_S]
#
# 1. benchmarks/device/attention_agreement.py: bit agreement of the fast decode kernel with each canonical kernel
# 2. benchmarks/serving.py on SmolLM2 (chat prompts): a short warm-up run (GGUF conversion, first compilations), then
#    three canonical-attention / fast-decode-kernel pairs, the same
#    workload and modes: throughput, rollbacks and recompute of the dvr modes, the batch_invariant baseline
# 3. the GPU tests not reached by the last call (the tiled kernels' bit tests first), verbose, with durations
# JSONs and one logs.txt go to $OUT; each step is bounded by timeout and its share of TOTAL_S (default 560).
set -uo pipefail
cd "$(dirname "$0")/../.."
TOTAL_S=${1:-560}
OUT=${OUT:-/tmp/llm42_out}
mkdir -p "$OUT"
LOGS=$(mktemp -d)  # every step's log, joined into $OUT/logs.txt at the end (at most 8 files come back)
export PYTHONUNBUFFERED=1 LLM42_GPU_TEST_LAYERS=${LLM42_GPU_TEST_LAYERS:-8}
if ! ls /root/smollm2/*.gguf >/dev/null 2>&1 && [ -f /root/smollm2.part_a ] && [ -d .dev_stage/b ]; then
    bash benchmarks/device/join_smollm2.sh >"$LOGS/join.log" 2>&1
fi
export PYTHONPATH="src:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
SMOL=$(ls /root/smollm2/*.gguf 2>/dev/null | head -n 1)
CACHE=/tmp/llm42_models
share() { echo $(( TOTAL_S * $1 / 100 )); }
step() {  # step NAME SECONDS COMMAND...
    local name=$1 secs=$2; shift 2
    local t0=$(date +%s)
    timeout --signal=TERM --kill-after=10 "$secs" "$@" >"$LOGS/$name.log" 2>&1
    echo "$name: exit $? after $(( $(date +%s) - t0 ))s (timeout ${secs}s)" | tee -a "$LOGS/0_steps.log"
}
step agreement "$(share 5)" python3 benchmarks/device/attention_agreement.py --out "$OUT/attention_agreement.json"
if [ -n "$SMOL" ]; then
    ARGS=(--device cuda --model "$SMOL" --cache-dir "$CACHE" --no-plots --max-fast-tokens 2048 --num-requests 512
          --modes nondet,dvr@10,dvr@50,dvr@100,batch_invariant --online-modes nondet,dvr@50 --online-loads 0.7
          --online-num-requests 300 --no-hf --steady-steps 64)
    # the GGUF conversion and the first compilations out of the timed runs: on a fresh machine they took the
    # whole budget of the first run (round 4's rows/split, benchmarks/results/h200_round4/README.md)
    step warmup "$(share 10)" python3 benchmarks/serving.py "${ARGS[@]}" --budget-s $(( $(share 10) - 5 )) \
        --num-requests 32 --modes nondet,dvr@50 --online-modes "" --out "$LOGS/warmup.json"
    # canonical attention / fast decode kernel: rows/split (round 3's bits), tiled/split (the default),
    # tiled/canonical (decode rows with the tiled kernel's canonical bits)
    for combo in rows/split tiled/split tiled/canonical; do
        secs=$(share 21)
        step "serving_${combo/\//_}" "$secs" python3 benchmarks/serving.py "${ARGS[@]}" --budget-s $(( secs - 15 )) \
            --canonical-attention "${combo%/*}" --fast-decode-kernel "${combo#*/}" \
            --out "$OUT/serving_smollm2_${combo/\//_}.json"
    done
else
    echo "no /root/smollm2/*.gguf: serving skipped" | tee -a "$LOGS/0_steps.log"
fi
T=tests/gpu/test_tiled_attention.py
step gpu_tests "$(share 19)" python3 -m pytest -v -p no:cacheprovider -m gpu --durations=20 \
    $T::test_decode_launch_gives_decode_rows_the_canonical_bits $T::test_fast_policy_canonical_decode_kernel_keeps_the_contract \
    $T::test_canonical_row_bits_do_not_depend_on_the_launch $T::test_canonical_row_bits_at_1_7_64_256_rows_and_any_index \
    $T::test_canonical_kv_does_not_depend_on_chunking $T::test_tiled_canonical_is_not_the_row_kernel_but_agrees_within_rounding \
    $T::test_canonical_pass_row_bits_do_not_depend_on_the_pass \
    $T::test_fast_policy_prefill_matches_the_canonical_pass_within_rounding \
    tests/gpu/test_doctor_cuda.py tests/test_batch_invariant.py tests/test_close.py tests/test_flash_backend.py \
    tests/test_sampling_kernels.py tests/test_plugin.py $T::test_tiled_canonical_matches_float64 tests/gpu/test_kernels.py
for f in "$LOGS"/*.log; do echo "=== $(basename "$f")"; grep -v 'it/s\]' "$f"; done >"$OUT/logs.txt" 2>&1
