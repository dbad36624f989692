#!/usr/bin/env bash
# Round 15, device call C: the GPU tests call A2 could not finish (tests/test_close.py after the canonical pass's
# own stream and the prioritize_fast stream became lent streams; the canonical-stream contract test in a pytest
# run of its own: in A2's mixed run its session fixture was not found), then the 8B shape's deterministic (and free)
# TTFT at 8,192 and 15,000 tokens (issue 12), a wide canonical pass's GEMM blocks in turn (the default) and on 4
# streams, two processes one after the other.
#
#   bash benchmarks/device/r15_call_c.sh [LONG_PROMPTS_BUDGET_S]
source "$(dirname "$0")/session_preamble.sh"
BUDGET=${1:-80}
timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_close.py >"$OUT/gpu_tests_close.txt" 2>&1
log "test_close exit $? ($(tail -n 1 "$OUT/gpu_tests_close.txt"))"
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_canonical_stream_cuda.py \
    >"$OUT/gpu_tests_stream.txt" 2>&1
log "test_canonical_stream_cuda exit $? ($(tail -n 1 "$OUT/gpu_tests_stream.txt"))"
grep -E "FAILED|ERROR|^E " "$OUT"/gpu_tests_*.txt | head -n 20
for streams in 1 4; do
    timeout $((BUDGET + 80)) python3 -m llm42.bench.long_prompts --device cuda --model 8b --lengths 8192,15000 \
        --reps 2 --budget-s "$BUDGET" --canonical-gemm-streams "$streams" --no-plots \
        --out "$OUT/long_prompts_8b_streams$streams.json" >>"$LOG" 2>&1
    log "long_prompts streams $streams exit $?"
done
python3 - "$OUT" <<'PY' 2>&1 | tee -a "$LOG"
import json, sys, pathlib
for streams in (1, 4):
    p = pathlib.Path(sys.argv[1]) / f"long_prompts_8b_streams{streams}.json"
    if not p.exists():
        print(streams, "missing"); continue
    d = json.loads(p.read_text())
    for row in d.get("ttft", []):
        print(streams, json.dumps(row)[:400])
PY
log "done"
