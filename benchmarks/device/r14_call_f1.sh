#!/usr/bin/env bash
# Round 14, device call F1 (carry .dev_stage/a; copies part_a to /root for call F2): the contract with
# prioritize_fast (each step's work on a high-priority stream, canonical passes on their own, lowest-priority
# stream): tests/gpu/test_canonical_stream_cuda.py with it on (8B shape: needles bit-identical alone and in
# random batches; the fast-only needle drifts: the control).
source "$(dirname "$0")/session_preamble.sh"
timeout "${1:-110}" python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_canonical_stream_cuda.py -k True \
    >"$OUT/gpu_tests_r14_priority.txt" 2>&1
log "gpu tests exit $? ($(tail -n 1 "$OUT/gpu_tests_r14_priority.txt"))"
grep -E "FAILED|ERROR|side_stream" "$OUT/gpu_tests_r14_priority.txt" | head -n 20
log "done"
