#!/usr/bin/env bash
# Round 50, device call C (carry .dev_stage/a: it stages the SmolLM2 GGUF's first half for r50_call_d.sh, issued
# at once after it with .dev_stage/b): the fused CUDA sampler (llm42.sampler.FUSED_CUDA_SAMPLER, on by default
# since round 50). First its GPU tests and the engine's contract tests, then the sampler alone against the torch
# ops on a float32 copy (sampler_ab.py: CUDA graphs, interleaved, bits compared), then the 8B shape offline
# (1,000 requests, 1,024 sequences, admission by budget, nondet) with and without it, ABBA in one process.
#
#   bash benchmarks/device/r50_call_c.sh
export RUN_TESTS=1 TEST_CAP=${TEST_CAP:-200}
export GPU_TESTS="tests/test_sampling_kernels.py tests/gpu/test_engine_cuda.py tests/gpu/test_pass_order_cuda.py"
source "$(dirname "$0")/stage_a.sh"
timeout 90 python3 benchmarks/device/sampler_ab.py --out "$OUT/sampler_ab.json" >"$OUT/sampler_ab.txt" 2>&1
log "sampler_ab exit $?"; cut -c1-300 "$OUT/sampler_ab.txt" | tail -n 12
timeout "${AB_CAP:-360}" python3 benchmarks/device/dvr_ab.py --model 8b \
    --variants admit_budget,admit_budget_sampler_unfused --modes nondet --repeats 2 --lm-head-std 0.2 \
    --lm-head-bias-scale 26.9 --max-num-seqs 1024 --budget-s 100 --warmup-requests 4 \
    --out "$OUT/dvr_ab_8b_sampler.json" >"$OUT/dvr_ab_8b_sampler.txt" 2>&1
log "8b A/B exit $?"; grep -E "tok/s|repeat|variant" "$OUT/dvr_ab_8b_sampler.txt" | cut -c1-200 | tail -n 12
log "done"
