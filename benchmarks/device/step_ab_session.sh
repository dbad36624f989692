#!/usr/bin/env bash
# One device call (issue 10): offline steps (benchmarks/device/profile_steps.py, mixed fast steps on, their
# decode rows padded to powers of two) side by side in one process per model: the decode kernel's split
# target (DECODE_SPLIT_WAVES 2, the old value, and 6, the new default) and, on SmolLM2, the fast prefill
# attention kernel's tiles (current, 32x64x2x2). SmolLM2 shape at max_num_seqs 256 and 1,024; 8B shape
# (500 requests) at 256. First tests/gpu/test_mixed_cuda.py; last benchmarks/serving.py on the 8B shape
# (offline nondet, 70 s), which captures every mixed graph before timing.
#
#   bash benchmarks/device/step_ab_session.sh       (OUT=... as the device tool sets it)
source "$(dirname "$0")/session_preamble.sh"
LLM42_GPU_TEST_LAYERS=8 timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_mixed_cuda.py \
    >"$OUT/gpu_tests_mixed_call5.txt" 2>&1
log "gpu tests exit $?"
tail -n 3 "$OUT/gpu_tests_mixed_call5.txt" >>"$LOG"
timeout 90 python3 benchmarks/device/profile_steps.py --out "$OUT/profile_steps_ab_smollm2_256.json" \
    --model smollm2 --max-num-seqs 256 --mixed-steps on --split-waves 2,6 --prefill-configs current,32x64x2x2 \
    >>"$LOG" 2>&1
log "smollm2 256 exit $?"
timeout 45 python3 benchmarks/device/profile_steps.py --out "$OUT/profile_steps_ab_smollm2_1024.json" \
    --model smollm2 --max-num-seqs 1024 --mixed-steps on --split-waves 2,6 >>"$LOG" 2>&1
log "smollm2 1024 exit $?"
timeout 85 python3 benchmarks/device/profile_steps.py --out "$OUT/profile_steps_ab_8b.json" \
    --model 8b --num-requests 500 --max-num-seqs 256 --mixed-steps on --split-waves 2,6 >>"$LOG" 2>&1
log "8b exit $?"
# the serving benchmark with every mixed graph captured before timing (capture_mixed_graphs), 8B shape
timeout 110 python3 benchmarks/serving.py --device cuda --model 8b --budget-s 70 --no-plots --no-hf \
    --max-fast-tokens 2048 --modes nondet --online-modes "" --out "$OUT/serving_8b_mixed_captured.json" >>"$LOG" 2>&1
log "serving 8b exit $?"
log "done"
