#!/usr/bin/env bash
# One device call (issue 10): mixed fast steps (decode rows and prompt chunks in one pass) on the H200.
# 1. GPU tests: tests/gpu/test_mixed_cuda.py and the needles of tests/gpu/test_engine_cuda.py (8 layers);
# 2. profile_steps.py, SmolLM2 shape: max_num_seqs 256 and 1,024, mixed steps on and off (A/B in one process);
# 3. profile_decode_step.py: the decode step's kernels at batch 16 / 96 / 256 (SmolLM2 shape) and 256 (8B);
# 4. decode_splits_sweep.py: the decode attention kernel by split count, timed inside CUDA graphs;
# 5. profile_steps.py, 8B shape, 500 requests: max_num_seqs 256, mixed on and off.
#
#   bash benchmarks/device/mixed_session.sh       (OUT=... as the device tool sets it)
source "$(dirname "$0")/session_preamble.sh"
LLM42_GPU_TEST_LAYERS=8 timeout 140 python3 -m pytest -v -p no:cacheprovider -m gpu --durations=6 \
    tests/gpu/test_mixed_cuda.py tests/gpu/test_engine_cuda.py >"$OUT/gpu_tests_mixed.txt" 2>&1
log "gpu tests exit $?"
tail -n 12 "$OUT/gpu_tests_mixed.txt" >>"$LOG"
timeout 130 python3 benchmarks/device/profile_steps.py --out "$OUT/profile_steps_mixed_smollm2.json" \
    --model smollm2 --max-num-seqs 256,1024 --mixed-steps on,off >>"$LOG" 2>&1
log "profile_steps smollm2 exit $?"
timeout 50 python3 benchmarks/device/profile_decode_step.py "$OUT/profile_decode_step_smollm2.json" \
    --model smollm2 --batches 16,96,256 >>"$LOG" 2>&1
log "profile_decode_step smollm2 exit $?"
timeout 35 python3 benchmarks/device/profile_decode_step.py "$OUT/profile_decode_step_8b.json" \
    --model 8b --batches 256 >>"$LOG" 2>&1
log "profile_decode_step 8b exit $?"
timeout 70 python3 benchmarks/device/decode_splits_sweep.py "$OUT/decode_splits_sweep_graphs.json" --reps 15 \
    >>"$LOG" 2>&1
log "decode_splits_sweep exit $?"
timeout 150 python3 benchmarks/device/profile_steps.py --out "$OUT/profile_steps_mixed_8b.json" \
    --model 8b --num-requests 500 --max-num-seqs 256 --mixed-steps on,off >>"$LOG" 2>&1
log "profile_steps 8b exit $?"
log "done"
