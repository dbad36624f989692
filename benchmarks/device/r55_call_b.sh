#!/usr/bin/env bash
# Round 55's second call (no carry), after call A measured the first kernel (3 ms for one top-p row, 7.9 ms for
# 1,056 rows at the 8B vocabulary): the kernel with weights of the raw logits (no division per value), int32 keys
# and 8 warps. The GPU tests of the sampler's kernels, the filter in the engine at the 8B shape and the engine
# contract; then sampler_ab.py --filtered.
#
#   [TEST_CAP=150] bash benchmarks/device/r55_call_b.sh
source "$(dirname "$0")/session_preamble.sh"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv | tee -a "$LOG"
export LLM42_GPU_REPORT="$OUT/gpu_report.jsonl" LLM42_FAIL_LOG="$OUT/failures.txt"
timeout "${TEST_CAP:-150}" python3 -m pytest -v -m gpu tests/test_sampling_kernels.py \
    tests/gpu/test_filter_kernel_cuda.py tests/gpu/test_engine_cuda.py -p no:cacheprovider -rfE --durations=5 \
    >"$OUT/gpu_tests.txt" 2>&1
log "gpu tests exit $?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu_tests.txt" | tail -n 12
timeout 90 python3 benchmarks/device/sampler_ab.py --filtered --out "$OUT/sampler_filtered.json" \
    >"$OUT/sampler_filtered.txt" 2>&1
log "sampler filtered exit $?"; cut -c1-330 "$OUT/sampler_filtered.txt" | tail -n 8
log "done"
