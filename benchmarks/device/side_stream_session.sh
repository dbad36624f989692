#!/usr/bin/env bash
# One device call: the canonical pass on its own CUDA stream (issue 10, "no global pause").
#
#   bash benchmarks/device/side_stream_session.sh [SERVING_BUDGET_S]     (OUT=... as the device tool sets it)
#
# Run it right after a call that copied .dev_stage/a/part_a to /root, carrying .dev_stage/b (the SmolLM2
# stage, as calibration_session.sh). In order, each step only if the one before passed:
# 1. tests/gpu/test_canonical_stream_cuda.py (LLM42_GPU_TEST_LAYERS=8): the needles bit for bit with the
#    side-stream pass, fast steps launched beside passes, the fast-path negative control;
# 2. benchmarks/serving.py on SmolLM2, offline nondet + online nondet and dvr@50 at 0.7 of capacity, once on
#    the caller's stream and once with --canonical-stream (free requests' ITL against nondet: target <= 1.15);
# 3. long_prompts' ITL phase on the 8B shape with and without --canonical-stream (LONG_PROMPTS=0: skipped).
# 4. EXTRA_TESTS (pytest paths, LLM42_GPU_TEST_LAYERS=8): run last, to gpu_tests_extra.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/llm42_out}
mkdir -p "$OUT"
LOG="$OUT/session_log.txt"
BUDGET=${1:-120}
START=$(date +%s)
log() { echo "[+$(( $(date +%s) - START ))s] $*" | tee -a "$LOG"; }
export PYTHONUNBUFFERED=1
if ! ls /root/smollm2/*.gguf >/dev/null 2>&1 && [ -f /root/smollm2.part_a ] && [ -d .dev_stage/b ]; then
    bash benchmarks/device/join_smollm2.sh >>"$LOG" 2>&1 || log "join_smollm2.sh failed"
fi
export PYTHONPATH="src:/tmp/site"
LLM42_GPU_TEST_LAYERS=8 timeout 150 python3 -m pytest -v -p no:cacheprovider -m gpu \
    tests/gpu/test_canonical_stream_cuda.py >"$OUT/gpu_tests_side_stream.txt" 2>&1
rc=$?
log "side-stream test exit $rc"
tail -n 5 "$OUT/gpu_tests_side_stream.txt" >>"$LOG"
(( rc == 0 )) || { log "stopping: the side-stream pass failed its contract test"; exit 1; }
SMOL=$(ls /root/smollm2/*.gguf 2>/dev/null | head -n 1)
if [ -n "$SMOL" ]; then
    for flag in "" "--canonical-stream"; do
        name=serving_smollm2_stream${flag:+_on}
        timeout $((BUDGET + 75)) python3 benchmarks/serving.py --device cuda --model "$SMOL" --cache-dir /tmp/llm42_models \
            --budget-s "$BUDGET" --no-plots --no-hf --max-fast-tokens 2048 --modes nondet --online-modes nondet,dvr@50 \
            --online-loads 0.7 $flag --out "$OUT/$name.json" >>"$LOG" 2>&1
        log "serving SmolLM2 ${flag:-(same stream)} exit $?"
    done
else
    log "no SmolLM2 GGUF staged: serving skipped"
fi
[ "${LONG_PROMPTS:-1}" = 1 ] && for flag in "" "--canonical-stream"; do
    timeout 100 python3 -m llm42.bench.long_prompts --device cuda --model 8b --lengths 8192 --reps 1 --budget-s 85 \
        --no-plots $flag --out "$OUT/long_prompts_stream${flag:+_on}.json" >>"$LOG" 2>&1
    log "long_prompts ${flag:-(same stream)} exit $?"
done
if [ -n "${EXTRA_TESTS:-}" ]; then
    LLM42_GPU_TEST_LAYERS=8 timeout "${EXTRA_TESTS_TIMEOUT:-150}" python3 -m pytest -v -p no:cacheprovider -m gpu \
        --durations=8 $EXTRA_TESTS >"$OUT/gpu_tests_extra.txt" 2>&1
    log "extra tests exit $?"
    tail -n 4 "$OUT/gpu_tests_extra.txt" >>"$LOG"
fi
log "done"
