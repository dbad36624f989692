#!/usr/bin/env bash
# One device call (issue 10, round 8): drafting ahead on CUDA, and what a canonical pass costs.
# 1. GPU tests (8 layers): the needles of tests/gpu/test_engine_cuda.py (deterministic requests draft ahead in
#    their batches), tests/gpu/test_mixed_cuda.py and tests/gpu/test_canonical_stream_cuda.py;
# 2. profile_passes.py, SmolLM2 and 8B shapes: verify and prompt-chunk passes by rows, against decode steps.
# Carry .dev_stage/a: its half of the SmolLM2 stage is copied to /root for the next call (draft_ahead_session.sh).
#
#   bash benchmarks/device/passes_session.sh       (OUT=... as the device tool sets it)
source "$(dirname "$0")/session_preamble.sh"
LLM42_GPU_TEST_LAYERS=8 timeout 200 python3 -m pytest -v -p no:cacheprovider -m gpu --durations=6 \
    tests/gpu/test_engine_cuda.py tests/gpu/test_mixed_cuda.py tests/gpu/test_canonical_stream_cuda.py \
    >"$OUT/gpu_tests_draft_ahead.txt" 2>&1
log "gpu tests exit $?"
tail -n 14 "$OUT/gpu_tests_draft_ahead.txt" >>"$LOG"
timeout 120 python3 benchmarks/device/profile_passes.py --model smollm2 --out "$OUT/passes_smollm2.json" >>"$LOG" 2>&1
log "profile_passes smollm2 exit $?"
timeout 150 python3 benchmarks/device/profile_passes.py --model 8b --out "$OUT/passes_8b.json" >>"$LOG" 2>&1
log "profile_passes 8b exit $?"
log "done"
