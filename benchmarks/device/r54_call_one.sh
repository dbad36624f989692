#!/usr/bin/env bash
# Round 54's calls A and B in one (devices were scarce: seven starts failed), each stage under what is left of
# ONE_CAP seconds: the GPU tests of the sampler (listed filter rows replayed from a graph), the listed filter in the
# engine (8B shape, graphs), mixed steps and the engine contract; sampler_ab.py --filtered (one top-p row: listed,
# chunked, whole, unfiltered); then the 8B shape's nondet with mixed steps against two passes (one repeat each), or
# with ONE_MEM=1 graph_memory.py: whether every mixed graph now captures at 1,024 sequences.
#
#   [ONE_CAP=585] [ONE_MEM=1] [TEST_CAP=230] bash benchmarks/device/r54_call_one.sh
export RUN_TESTS=1 TEST_CAP=${TEST_CAP:-230}
export GPU_TESTS="tests/test_sampling_kernels.py tests/gpu/test_filter_rows_cuda.py tests/gpu/test_mixed_cuda.py
tests/gpu/test_engine_cuda.py"
source "$(dirname "$0")/stage_a.sh"
left() { echo $(( ${ONE_CAP:-585} - ($(date +%s) - START) )); }
timeout "$(( $(left) < 80 ? $(left) : 80 ))" python3 benchmarks/device/sampler_ab.py --filtered \
    --out "$OUT/sampler_filtered.json" >"$OUT/sampler_filtered.txt" 2>&1
log "sampler filtered exit $?"; cut -c1-400 "$OUT/sampler_filtered.txt" | tail -n 8
ARGS="--model 8b --lm-head-std 0.2 --lm-head-bias-scale 26.9 --max-num-seqs 1024 --warmup-requests 0"
if [ "${ONE_MEM:-0}" = 1 ]; then  # whether every mixed graph now captures at 1,024 sequences (round 53: out of memory)
    # shellcheck disable=SC2086  # ARGS is a list of options
    timeout "$(( $(left) - 5 ))" python3 benchmarks/device/graph_memory.py $ARGS --variant admit_budget \
        --out "$OUT/graph_memory_8b.json" >"$OUT/graph_memory_8b.txt" 2>&1
    log "graph memory exit $?"; grep -E "captured|OOM" "$OUT/graph_memory_8b.txt" | cut -c1-250
else
    # shellcheck disable=SC2086
    timeout "$(( $(left) - 5 ))" python3 benchmarks/device/dvr_ab.py $ARGS --variants admit_budget,admit_budget_no_mixed \
        --modes nondet --repeats 1 --budget-s 70 --out "$OUT/dvr_ab_8b_mixed.json" >"$OUT/dvr_ab_8b_mixed.txt" 2>&1
    log "8b mixed exit $?"; grep -E "tok/s|median|note" "$OUT/dvr_ab_8b_mixed.txt" | cut -c1-200 | tail -n 12
fi
log "done"
