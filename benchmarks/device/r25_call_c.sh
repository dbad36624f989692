#!/usr/bin/env bash
# Round 25, device call C (carries .dev_stage/a): the GPU tests of the canonical pass on a share of the SMs
# (tests/gpu/test_canonical_sms_cuda.py: the SMs its stream reaches, needles bit-identical) and the canonical-stream
# contract test beside it.
#
#   bash benchmarks/device/r25_call_c.sh
source "$(dirname "$0")/session_preamble.sh"
export LLM42_GPU_REPORT="$OUT/gpu_report.jsonl"
timeout 300 python3 -m pytest -q -m gpu tests/gpu/test_canonical_sms_cuda.py tests/gpu/test_canonical_stream_cuda.py \
    -p no:cacheprovider >"$OUT/gpu_tests_c.txt" 2>&1
log "gpu tests exit $?"; tail -n 8 "$OUT/gpu_tests_c.txt"
grep canonical_sms "$LLM42_GPU_REPORT" 2>/dev/null
log "done"
