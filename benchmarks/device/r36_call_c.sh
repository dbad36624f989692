#!/usr/bin/env bash
# Round 36, device call C (carries .dev_stage/a, copied to /root for the SmolLM2 call right after): call A showed a
# fast decode step slowed beside a pass (64 rows: 1.47 -> 1.86 ms beside a 32-row pass, -> 2.37 ms beside a 2,048-row
# one) and a fused pass (the decode rows as one-row canonical segments) slower than the two side by side. Here
# profile_passes.py --beside again with the decode step on a stream of the highest priority and the pass on one of the
# lowest (what DVRGenerator(prioritize_fast=True) does; round 14 measured it on an older engine: no change), and the
# GPU test that compares prioritize_fast's committed bits (tests/gpu/test_canonical_stream_cuda.py; with RUN_TESTS=1:
# the round's device time ran short, no engine code changed since it passed on the H200 in round 14).
#
#   bash benchmarks/device/r36_call_c.sh
source "$(dirname "$0")/session_preamble.sh"
if [ "${RUN_TESTS:-0}" = 1 ]; then
    export LLM42_GPU_REPORT="$OUT/gpu_report_c.jsonl" LLM42_FAIL_LOG="$OUT/failures.txt"
    timeout "${TEST_CAP:-150}" python3 -m pytest -v -m gpu tests/gpu/test_canonical_stream_cuda.py -p no:cacheprovider \
        -rfE --durations=5 >"$OUT/gpu_tests_c.txt" 2>&1
    log "gpu tests exit $?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu_tests_c.txt" | tail -n 12
fi
timeout "${PROFILE_CAP:-150}" python3 benchmarks/device/profile_passes.py --model smollm2 --beside \
    --out "$OUT/passes_beside_priority_smollm2.json" >"$OUT/passes_beside_priority.txt" 2>&1
log "profile_passes --beside exit $?"; grep -E "^beside|^NVIDIA|rror" "$OUT/passes_beside_priority.txt" | tail -n 20
log "done"
