#!/usr/bin/env bash
# Round 15, device call C: the 8B shape's deterministic (and free) TTFT at 8,192 and 15,000 tokens (issue 12),
# a wide canonical pass's GEMM blocks on 4 streams (the default) and in turn, two processes one after the other.
#
#   bash benchmarks/device/r15_call_c.sh [LONG_PROMPTS_BUDGET_S]
source "$(dirname "$0")/session_preamble.sh"
BUDGET=${1:-100}
for streams in 4 1; do
    timeout $((BUDGET + 90)) python3 -m llm42.bench.long_prompts --device cuda --model 8b --lengths 8192,15000 \
        --reps 2 --budget-s "$BUDGET" --canonical-gemm-streams "$streams" --no-plots \
        --out "$OUT/long_prompts_8b_streams$streams.json" >>"$LOG" 2>&1
    log "long_prompts streams $streams exit $?"
done
python3 - "$OUT" <<'PY' 2>&1 | tee -a "$LOG"
import json, sys, pathlib
for streams in (4, 1):
    p = pathlib.Path(sys.argv[1]) / f"long_prompts_8b_streams{streams}.json"
    if not p.exists():
        print(streams, "missing"); continue
    d = json.loads(p.read_text())
    for row in d.get("ttft", []):
        print(streams, json.dumps(row)[:400])
PY
log "done"
