#!/usr/bin/env bash
# Round 24, device call E (carries .dev_stage/a): the risk-margin GPU test with risky windows riding the next pass
# (DefaultScheduler(risky_windows="ride"), the default since calls B-D), and the SmolLM2 stage's first half to /root.
#
#   bash benchmarks/device/r24_call_e.sh
source "$(dirname "$0")/session_preamble.sh"
export LLM42_GPU_REPORT="$OUT/gpu_report.jsonl"
timeout 120 python3 -m pytest -q -m gpu tests/gpu/test_risk_margin_cuda.py -p no:cacheprovider \
    >"$OUT/gpu_tests_e.txt" 2>&1
log "gpu tests exit $?"; tail -n 3 "$OUT/gpu_tests_e.txt"
cat "$LLM42_GPU_REPORT" 2>/dev/null | grep risk
log "done"
