#!/usr/bin/env bash
# For the next device session (issue 10), call A: copies .dev_stage/a/part_a to /root for call B (when carried);
# then the GPU tests of the chunked canonical attention (kernel bits: decode = packed = verify window; the policy's
# routing; the contract under the chunked canonical policy). Written in round 11, not yet run.
#
#   bash benchmarks/device/chunked_call_a.sh [TIMEOUT_S]
source "$(dirname "$0")/session_preamble.sh"
LIMIT=${1:-240}
timeout "$LIMIT" python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_tiled_attention.py \
    -k "chunked or routes or decode_kernel" >"$OUT/gpu_tests_chunked.txt" 2>&1
log "gpu tests exit $? ($(tail -n 1 "$OUT/gpu_tests_chunked.txt"))"
grep -E "FAILED|ERROR" "$OUT/gpu_tests_chunked.txt" | head -n 20
log "done"
