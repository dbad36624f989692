#!/usr/bin/env bash
# Next device call A (carry .dev_stage/a; r54_call_b.sh may follow at once, then stage_a.sh with .dev_stage/m and
# a SmolLM2 call with .dev_stage/b). Round 53's chunked top-k / top-p threshold (llm42.sampler.FILTER_CHUNK_ELEMENTS),
# CPU-tested only: the GPU tests of the sampler, the engine contract, mixed steps and graph capture; a step with one
# top-p row, the threshold chunked against whole (sampler_ab.py --filtered: time, peak memory, bits); then
# graph_memory.py on the 8B shape at 1,024 sequences: whether every mixed graph now captures (round 53's call D: out
# of memory at the third of 418, the filter's float64 temporaries at 1,056 rows). Stages the SmolLM2 GGUF's first third.
#
#   [MEM_CAP=0 (no graph_memory.py)] bash benchmarks/device/r54_call_a.sh
export RUN_TESTS=1 TEST_CAP=${TEST_CAP:-200}
export GPU_TESTS="tests/test_sampling_kernels.py tests/gpu/test_engine_cuda.py tests/gpu/test_mixed_cuda.py
tests/gpu/test_capture_graphs_cuda.py tests/gpu/test_filter_rows_cuda.py"
source "$(dirname "$0")/stage_a.sh"
timeout "${SAMPLER_CAP:-90}" python3 benchmarks/device/sampler_ab.py --filtered --out "$OUT/sampler_filtered.json" \
    >"$OUT/sampler_filtered.txt" 2>&1
log "sampler filtered exit $?"; cut -c1-330 "$OUT/sampler_filtered.txt" | tail -n 8
if [ "${MEM_CAP:-200}" != 0 ]; then
ARGS="--model 8b --lm-head-std 0.2 --lm-head-bias-scale 26.9 --max-num-seqs 1024 --warmup-requests 0"
# shellcheck disable=SC2086  # ARGS is a list of options
timeout "${MEM_CAP:-200}" python3 benchmarks/device/graph_memory.py $ARGS --variant admit_budget \
    --out "$OUT/graph_memory_8b.json" >"$OUT/graph_memory_8b.txt" 2>&1
log "graph memory exit $?"; grep -E "captured|OOM" "$OUT/graph_memory_8b.txt" | cut -c1-250
fi
log "done"
