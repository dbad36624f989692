#!/usr/bin/env bash
# Round 9, device call A (issue 10): copies .dev_stage/a/part_a to /root for call B; the side-stream and
# drafting-ahead GPU contract tests; then the 8B shape (random weights), 1,000 requests offline, nondet, at
# max_num_seqs 512 and 1,024 with every graph captured before timing (round 7 measured 9.0-10.8K with the
# captures inside its timed runs).
#
#   bash benchmarks/device/r9_call_a.sh [BUDGET_S]       (OUT=... as the device tool sets it)
source "$(dirname "$0")/session_preamble.sh"
BUDGET=${1:-110}
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_canonical_stream_cuda.py \
    tests/gpu/test_engine_cuda.py >"$OUT/gpu_tests_side_stream.txt" 2>&1
log "gpu tests exit $? ($(tail -n 1 "$OUT/gpu_tests_side_stream.txt"))"
for SEQS in 512 1024; do
    timeout $((BUDGET + 90)) python3 benchmarks/serving.py --device cuda --model 8b --budget-s "$BUDGET" \
        --num-requests 1000 --no-plots --no-hf --max-fast-tokens 2048 --max-num-seqs "$SEQS" --modes nondet \
        --online-modes "" --out "$OUT/serving_8b_seqs$SEQS.json" >>"$LOG" 2>&1
    log "serving 8b max_num_seqs $SEQS exit $?"
done
log "done"
