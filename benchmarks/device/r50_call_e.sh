#!/usr/bin/env bash
# Round 50, device call E (carry .dev_stage/a; r50_call_d.sh with .dev_stage/b at once after it): the fused CUDA
# sampler after call C's failure (a float32 copy's row sums differ from the bf16 logits' ones; since commit "sampler: row statistics read the head's logits as they are"
# every path's row statistics read the head's logits as they are): its GPU tests, the engine's contract tests and
# those of the paths that sample (mixed steps, RL log-probs, risk margins, graph capture), then sampler_ab.py
# (bits and time against the float32 copy's torch ops).
#
#   bash benchmarks/device/r50_call_e.sh
export RUN_TESTS=1 TEST_CAP=${TEST_CAP:-190}
export GPU_TESTS="tests/test_sampling_kernels.py tests/gpu/test_engine_cuda.py tests/gpu/test_pass_order_cuda.py
    tests/gpu/test_mixed_cuda.py tests/gpu/test_rl_cuda.py tests/gpu/test_risk_margin_cuda.py"
source "$(dirname "$0")/stage_a.sh"
timeout 60 python3 benchmarks/device/sampler_ab.py --out "$OUT/sampler_ab.json" >"$OUT/sampler_ab.txt" 2>&1
log "sampler_ab exit $?"; cut -c1-300 "$OUT/sampler_ab.txt" | tail -n 12
log "done"
