#!/usr/bin/env bash
# Round 55's call (no carry): the GPU tests of the top-k / top-p threshold's kernel (kernels.sampling.filter_threshold:
# the float64 definition, row independence, from a graph; in the engine's decode, mixed and canonical graphs), the
# sampler's, mixed steps', the engine contract's (with its top-p needle); sampler_ab.py --filtered (the kernel
# against the torch filter, one top-p row and every row); graph_memory.py
# (whether every 8B mixed graph now captures at 1,024 sequences, the filter's temporaries gone); then the 8B shape's
# nondet with mixed steps against two passes (one repeat each), each stage under what is left of ONE_CAP seconds.
#
#   [ONE_CAP=580] [TEST_CAP=200] bash benchmarks/device/r55_call_one.sh
source "$(dirname "$0")/session_preamble.sh"
left() { echo $(( ${ONE_CAP:-580} - ($(date +%s) - START) )); }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv | tee -a "$LOG"
export LLM42_GPU_REPORT="$OUT/gpu_report.jsonl" LLM42_FAIL_LOG="$OUT/failures.txt"
timeout "${TEST_CAP:-200}" python3 -m pytest -v -m gpu tests/test_sampling_kernels.py \
    tests/gpu/test_filter_kernel_cuda.py tests/gpu/test_mixed_cuda.py tests/gpu/test_engine_cuda.py \
    -p no:cacheprovider -rfE --durations=5 \
    >"$OUT/gpu_tests.txt" 2>&1
log "gpu tests exit $?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu_tests.txt" | tail -n 12
timeout "$(( $(left) < 90 ? $(left) : 90 ))" python3 benchmarks/device/sampler_ab.py --filtered \
    --out "$OUT/sampler_filtered.json" >"$OUT/sampler_filtered.txt" 2>&1
log "sampler filtered exit $?"; cut -c1-400 "$OUT/sampler_filtered.txt" | tail -n 8
ARGS="--model 8b --lm-head-std 0.2 --lm-head-bias-scale 26.9 --max-num-seqs 1024 --warmup-requests 0"
# shellcheck disable=SC2086  # ARGS is a list of options
timeout "$(( $(left) < 150 ? $(left) : 150 ))" python3 benchmarks/device/graph_memory.py $ARGS --variant admit_budget \
    --out "$OUT/graph_memory_8b.json" >"$OUT/graph_memory_8b.txt" 2>&1
log "graph memory exit $?"; grep -E "captured|OOM|rror" "$OUT/graph_memory_8b.txt" | cut -c1-250 | tail -n 8
# shellcheck disable=SC2086
timeout "$(( $(left) - 5 ))" python3 benchmarks/device/dvr_ab.py $ARGS --variants admit_budget,admit_budget_no_mixed \
    --modes nondet --repeats 1 --budget-s 70 --out "$OUT/dvr_ab_8b_mixed.json" >"$OUT/dvr_ab_8b_mixed.txt" 2>&1
log "8b mixed exit $?"; grep -E "tok/s|median|note" "$OUT/dvr_ab_8b_mixed.txt" | cut -c1-200 | tail -n 12
log "done"
