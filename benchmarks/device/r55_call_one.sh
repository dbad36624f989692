#!/usr/bin/env bash
# Round 55's call (no carry): the GPU tests of the top-k / top-p threshold's kernel (kernels.sampling.filter_threshold:
# the float64 definition, row independence, from a graph; in the engine's decode, mixed and canonical graphs), the
# sampler's, mixed steps', the engine contract's (with its top-p needle); sampler_ab.py --filtered (the kernel
# against the torch filter, one top-p row and every row); then the 8B shape's nondet with mixed steps against two
# passes (one repeat each; each run's notes say whether every mixed graph captured at 1,024 sequences, the filter's
# temporaries gone), or with ONE_MEM=1 graph_memory.py instead. Each stage runs under what is left of ONE_CAP
# seconds. Should the kernel not run on this GPU (a smoke check after the tests), the A/B serves the torch filter.
#
#   [ONE_CAP=560] [ONE_MEM=1] [TEST_CAP=240] bash benchmarks/device/r55_call_one.sh
source "$(dirname "$0")/session_preamble.sh"
run_gpu_tests tests/test_sampling_kernels.py tests/gpu/test_filter_kernel_cuda.py tests/gpu/test_mixed_cuda.py \
    tests/gpu/test_engine_cuda.py
SUFFIX=""
if ! timeout 60 python3 -c "
import torch
from llm42.kernels.sampling import filter_threshold, row_stats
x = torch.randn(4, 128256, device='cuda').bfloat16()
_, mx, _, mn = row_stats(x, row_min=True)
t = filter_threshold(x, torch.ones(4, device='cuda'), mx, mn, torch.tensor([0, 5, 0, 0], device='cuda'),
                     torch.tensor([0.9, 1.0, 0.5, 1.0], device='cuda'))
assert bool(torch.isfinite(t[:3]).all()) and float(t[3]) == float('-inf'), t
" >"$OUT/kernel_smoke.txt" 2>&1; then
    SUFFIX="_torch_filter"; log "filter kernel smoke FAILED: the A/B serves the torch filter"
    tail -n 5 "$OUT/kernel_smoke.txt"
fi
timeout "$(( $(left) < 80 ? $(left) : 80 ))" python3 benchmarks/device/sampler_ab.py --filtered \
    --out "$OUT/sampler_filtered.json" >"$OUT/sampler_filtered.txt" 2>&1
log "sampler filtered exit $?"; cut -c1-400 "$OUT/sampler_filtered.txt" | tail -n 8
ARGS="--model 8b --lm-head-std 0.2 --lm-head-bias-scale 26.9 --max-num-seqs 1024 --warmup-requests 0"
if [ "${ONE_MEM:-0}" = 1 ]; then
    # shellcheck disable=SC2086  # ARGS is a list of options
    timeout "$(( $(left) - 5 ))" python3 benchmarks/device/graph_memory.py $ARGS --variant "admit_budget$SUFFIX" \
        --out "$OUT/graph_memory_8b.json" >"$OUT/graph_memory_8b.txt" 2>&1
    log "graph memory exit $?"; grep -E "captured|OOM|rror" "$OUT/graph_memory_8b.txt" | cut -c1-250 | tail -n 8
else
    # shellcheck disable=SC2086
    timeout "$(( $(left) - 5 ))" python3 benchmarks/device/dvr_ab.py $ARGS \
        --variants "admit_budget$SUFFIX,admit_budget_no_mixed$SUFFIX" --modes nondet --repeats 1 --budget-s 100 \
        --out "$OUT/dvr_ab_8b_mixed.json" >"$OUT/dvr_ab_8b_mixed.txt" 2>&1
    log "8b mixed exit $?"; grep -E "tok/s|median|note" "$OUT/dvr_ab_8b_mixed.txt" | cut -c1-200 | tail -n 12
fi
log "done"
