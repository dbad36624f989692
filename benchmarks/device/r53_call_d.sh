#!/usr/bin/env bash
# Round 53, device call D (no carry). Round 53's one graph pool for the fast path's decode, prefill and mixed graphs
# (llm42.engine.fast_step.SHARED_GRAPH_POOL): the 8B shape's dvr_ab runs had printed "mixed-step CUDA graphs failed
# (OutOfMemoryError)" in every run (call B), so their steps with prompt rows ran as two passes. First the GPU tests
# of graph capture and mixed steps; then the 8B shape's nondet with one pool against a pool per kind (the tree
# before), REPEATS times (ABBA) in one process, without warm-up runs (each build captures every graph, which
# compiles every kernel); then, in what time is left, graph_memory.py: memory by kind of graph under both layouts.
#
#   [REPEATS=1] bash benchmarks/device/r53_call_d.sh
source "$(dirname "$0")/session_preamble.sh"
timeout "${TEST_CAP:-75}" python3 -m pytest -q -m gpu tests/gpu/test_capture_graphs_cuda.py \
    tests/gpu/test_mixed_cuda.py -p no:cacheprovider -rfE >"$OUT/gpu_tests_d.txt" 2>&1
log "gpu tests exit $?"; tail -n 3 "$OUT/gpu_tests_d.txt"
ARGS="--model 8b --lm-head-std 0.2 --lm-head-bias-scale 26.9 --max-num-seqs 1024 --warmup-requests 0"
# shellcheck disable=SC2086  # ARGS is a list of options
timeout "${DVR_CAP:-230}" python3 benchmarks/device/dvr_ab.py $ARGS --variants admit_budget,admit_budget_pool_each \
    --modes nondet --repeats "${REPEATS:-1}" --budget-s 70 --out "$OUT/dvr_ab_8b_pool.json" \
    >"$OUT/dvr_ab_8b_pool.txt" 2>&1
log "8b pools exit $?"; grep -E "tok/s|median|note" "$OUT/dvr_ab_8b_pool.txt" | cut -c1-200 | tail -n 12
# shellcheck disable=SC2086
timeout "${MEM_CAP:-150}" python3 benchmarks/device/graph_memory.py $ARGS --variant admit_budget --pools shared,each \
    --out "$OUT/graph_memory_8b.json" >"$OUT/graph_memory_8b.txt" 2>&1
log "graph memory exit $?"; grep -E "captured|OOM" "$OUT/graph_memory_8b.txt" | cut -c1-250
log "done"
