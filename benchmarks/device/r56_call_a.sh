#!/usr/bin/env bash
# Round 56's first call (no carry): the top-k / top-p threshold's search split over programs of a few blocks each
# (kernels.sampling.FILTER_CHUNK_BLOCKS; round 55 ran a row in one program, on one SM). The GPU tests of the
# sampler's kernels (the threshold at every split against the float64 definition), the filter in the engine's
# decode, mixed and canonical graphs, mixed steps and the engine contract; sampler_ab.py --filtered (the split
# against one program per row and the torch filter); then the 8B shape served with 10 of 1,000 requests asking
# for top_p = 0.9, nondet, admission by budget: the split (default) against one program per row
# (admit_budget_filter_whole), one run each; on an H200 instead (H200_PLAIN=1, the default) the plain set,
# nondet, admission by budget (the 14K target's card). Each stage runs under what is left of ONE_CAP seconds.
#
#   [ONE_CAP=560] [TEST_CAP=200] [TOP_P=10] [H200_PLAIN=1] bash benchmarks/device/r56_call_a.sh
source "$(dirname "$0")/session_preamble.sh"
TEST_CAP=${TEST_CAP:-200} run_gpu_tests tests/test_sampling_kernels.py tests/gpu/test_filter_kernel_cuda.py \
    tests/gpu/test_mixed_cuda.py tests/gpu/test_engine_cuda.py
timeout "$(( $(left) < 110 ? $(left) : 110 ))" python3 benchmarks/device/sampler_ab.py --filtered \
    --out "$OUT/sampler_filtered.json" >"$OUT/sampler_filtered.txt" 2>&1
log "sampler filtered exit $?"; cut -c1-500 "$OUT/sampler_filtered.txt" | tail -n 8
ARGS="--model 8b --lm-head-std 0.2 --lm-head-bias-scale 26.9 --max-num-seqs 1024 --warmup-requests 0"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && [ "${H200_PLAIN:-1}" = 1 ]; then
    # an H200 (the target's card, not measured on the 8B shape since round 35): the plain set, nondet, first
    # shellcheck disable=SC2086  # ARGS is a list of options
    timeout "$(( $(left) - 5 ))" python3 benchmarks/device/dvr_ab.py $ARGS --variants admit_budget --modes nondet \
        --repeats 1 --budget-s 100 --out "$OUT/dvr_ab_8b_h200.json" >"$OUT/dvr_ab_8b_h200.txt" 2>&1
    log "8b h200 exit $?"; grep -E "tok/s|median|note" "$OUT/dvr_ab_8b_h200.txt" | cut -c1-200 | tail -n 8
else
    # shellcheck disable=SC2086
    timeout "$(( $(left) - 5 ))" python3 benchmarks/device/dvr_ab.py $ARGS \
        --variants admit_budget,admit_budget_filter_whole --modes nondet --repeats 1 --budget-s 100 \
        --top-p-requests "${TOP_P:-10}" --out "$OUT/dvr_ab_8b_top_p.json" >"$OUT/dvr_ab_8b_top_p.txt" 2>&1
    log "8b top-p exit $?"; grep -E "tok/s|median|note" "$OUT/dvr_ab_8b_top_p.txt" | cut -c1-200 | tail -n 8
fi
log "done"
