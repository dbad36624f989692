#!/usr/bin/env bash
# Round 24, device call C (carries .dev_stage/a): the risk-margin GPU test again after drafting ahead was let run
# past risky drafts (a risky draft ends its window, never the drafting), then the SmolLM2 stage's first half to /root.
#
#   bash benchmarks/device/r24_call_c.sh
source "$(dirname "$0")/session_preamble.sh"
CALL=${CALL:-c}  # call E runs this script too
export LLM42_GPU_REPORT="$OUT/gpu_report.jsonl"
timeout 120 python3 -m pytest -q -m gpu tests/gpu/test_risk_margin_cuda.py -p no:cacheprovider \
    >"$OUT/gpu_tests_$CALL.txt" 2>&1
log "gpu tests exit $?"; tail -n 3 "$OUT/gpu_tests_$CALL.txt"
cat "$LLM42_GPU_REPORT" 2>/dev/null | grep risk
log "done"
