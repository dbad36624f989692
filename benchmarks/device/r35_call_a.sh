#!/usr/bin/env bash
# Round 35, device call A (carries .dev_stage/a, copied to /root for r35_call_b.sh right after): the GPU tests of
# round 34's engine options: canonical passes in layer slices (tests/gpu/test_canonical_slices_cuda.py, never run
# yet) and the two pass step orders (tests/gpu/test_pass_order_cuda.py, passed on an H200 in round 34); then
# profile_passes.py on the SmolLM2 shape with passes in 4 slices: each slice's device ms against the whole pass's, and
# every pass launch's host time by function (--host-profile): round 34's stage took 0.46-0.72 ms for passes of R rows
# or fewer and 0.91-1.45 ms for wider ones on an H100's host, where this 2-core CPU stages and applies a 64-window pass
# in 0.62 ms (cpu_host_ab, round 35): what the wide passes' extra host time on the GPU's host is.
#
#   bash benchmarks/device/r35_call_a.sh
source "$(dirname "$0")/session_preamble.sh"
export LLM42_GPU_REPORT="$OUT/gpu_report_a.jsonl" LLM42_FAIL_LOG="$OUT/failures.txt"
timeout "${TEST_CAP:-150}" python3 -m pytest -v -m gpu tests/gpu/test_canonical_slices_cuda.py \
    tests/gpu/test_pass_order_cuda.py -p no:cacheprovider -rfE --durations=5 >"$OUT/gpu_tests_a.txt" 2>&1
log "gpu tests exit $?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu_tests_a.txt" | tail -n 12
timeout "${PROFILE_CAP:-90}" python3 benchmarks/device/profile_passes.py --model smollm2 --canonical-slices 4 \
    --host-profile --out "$OUT/passes_slices4_smollm2.json" >"$OUT/passes_slices4.txt" 2>&1
log "profile_passes (4 slices) exit $?"; tail -n 14 "$OUT/passes_slices4.txt"
log "done"
