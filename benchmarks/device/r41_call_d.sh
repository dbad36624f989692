#!/usr/bin/env bash
# Round 41, device call D (carry .dev_stage/a and .dev_stage/base; stages the GGUF's first half for r41_call_c.sh
# right after it): the GPU tests of the packed staging (StaticRows / PackedStaging: canonical passes, fast prompt
# steps, chained passes with its negative control), then a canonical pass's host time, the packed staging against
# the tree before it (.dev_stage/base: `git archive 663dbc2 src benchmarks/device benchmarks/*.py`), in separate
# processes, ABBA: profile_passes.py (SmolLM2's shape, random weights; stage and launch host ms per pass shape).
#
#   bash benchmarks/device/r41_call_d.sh
source "$(dirname "$0")/session_preamble.sh"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv | tee -a "$LOG"
python3 -c "import sys; sys.path.insert(0, 'src'); from llm42.bench.hostprobe import host_probe; print('host probe', host_probe())" | tee -a "$LOG"
export LLM42_GPU_REPORT="$OUT/gpu_report_d.jsonl" LLM42_FAIL_LOG="$OUT/failures.txt"
timeout "${TEST_CAP:-240}" python3 -m pytest -v -m gpu tests/gpu/test_chained_prefill_cuda.py \
    tests/gpu/test_engine_cuda.py tests/gpu/test_mixed_cuda.py tests/gpu/test_wide_pass_cuda.py \
    tests/gpu/test_prompt_drafts_cuda.py -p no:cacheprovider -rfE --durations=5 >"$OUT/gpu_tests_d.txt" 2>&1
log "gpu tests exit $?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu_tests_d.txt" | tail -n 12
for tag in base1 packed1 packed2 base2; do
    tree=.; case $tag in base*) tree=.dev_stage/base;; esac
    timeout 90 python3 "$tree/benchmarks/device/profile_passes.py" --model smollm2 --out "$OUT/passes_$tag.json" \
        --max-canonical-tokens 512 --reps 30 >"$OUT/passes_$tag.txt" 2>&1
    log "$tag exit $?"; grep -E "^(verify|chunk)" "$OUT/passes_$tag.txt"
done
log "done"
