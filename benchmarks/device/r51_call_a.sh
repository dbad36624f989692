#!/usr/bin/env bash
# Next device call A (carry .dev_stage/a; r51_call_b.sh with .dev_stage/b at once after it). What round 50 built
# after its device time ran out, both off by default: the Gumbel kernel skipping greedy rows
# (kernels.sampling.GUMBEL_SKIP_GREEDY) and its sweep split over several programs per row (GUMBEL_TARGET_PROGRAMS).
# First the sampler's GPU tests (run_checks on CUDA covers the split, ties across chunks; the fused sampler's test
# both skips) and the engine's contract tests, then sampler_ab.py (fused / float32 copy / skipping greedy rows /
# split over ~512 and ~2,048 programs, both; greedy, half and all sampled rows; bits compared), then the decode
# attention's launch at small multi-split batches (round 50: longest-first was 1.40x slower than the
# sequence-major grid at round 47's 37-sequence tail; one sample).
#
#   bash benchmarks/device/r51_call_a.sh
export RUN_TESTS=1 TEST_CAP=${TEST_CAP:-150}
export GPU_TESTS="tests/test_sampling_kernels.py tests/gpu/test_engine_cuda.py"
source "$(dirname "$0")/stage_a.sh"
timeout 90 python3 benchmarks/device/sampler_ab.py --out "$OUT/sampler_ab.json" >"$OUT/sampler_ab.txt" 2>&1
log "sampler_ab exit $?"; cut -c1-400 "$OUT/sampler_ab.txt" | tail -n 18
timeout "${SWEEP_CAP:-150}" python3 benchmarks/device/decode_attention_sweep.py --batches tails \
    --out "$OUT/decode_attention_tails.json" --reps "${REPS:-30}" --block-n 64,128 --warps 4,8 --stages 3 \
    >"$OUT/decode_attention_tails.txt" 2>&1
log "tails sweep exit $?"; grep '"by_order"' "$OUT/decode_attention_tails.txt" | cut -c1-400
log "done"
