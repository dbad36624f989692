#!/usr/bin/env bash
# Round 23, device call C (carries .dev_stage/a, for call D right after): the engine's CUDA contract tests with
# every plan chained (then the default): needles alone and in random batches, the canonical stream, draft-ahead.
#
# It ran while "all" was the tree's default; run now, these tests take the current default ("prompts").
#
#   bash benchmarks/device/r23_call_c.sh
source "$(dirname "$0")/session_preamble.sh"
timeout 200 python3 -m pytest -q -m gpu tests/gpu/test_engine_cuda.py tests/gpu/test_canonical_stream_cuda.py \
    -p no:cacheprovider >"$OUT/gpu_tests_c.txt" 2>&1
log "gpu tests (engine, canonical stream) exit $?"; tail -n 3 "$OUT/gpu_tests_c.txt"
log "done"
