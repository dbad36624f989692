#!/usr/bin/env bash
# Round 55's second call (no carry), after call A measured the first kernel (3 ms for one top-p row, 7.9 ms for
# 1,056 rows at the 8B vocabulary): the kernel with weights of the raw logits (no division per value), int32 keys
# and 8 warps. The GPU tests of the sampler's kernels, the filter in the engine at the 8B shape and the engine
# contract; then sampler_ab.py --filtered.
#
#   [TEST_CAP=150] bash benchmarks/device/r55_call_b.sh
source "$(dirname "$0")/session_preamble.sh"
TEST_CAP=${TEST_CAP:-150} run_gpu_tests tests/test_sampling_kernels.py tests/gpu/test_filter_kernel_cuda.py \
    tests/gpu/test_engine_cuda.py
timeout 90 python3 benchmarks/device/sampler_ab.py --filtered --out "$OUT/sampler_filtered.json" \
    >"$OUT/sampler_filtered.txt" 2>&1
log "sampler filtered exit $?"; cut -c1-330 "$OUT/sampler_filtered.txt" | tail -n 8
log "done"
