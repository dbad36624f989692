#!/usr/bin/env bash
# Round 13, device call C: the 8B shape (random weights, bf16). What a canonical pass costs with each canonical GEMM
# (profile_passes.py), then issue 12's deterministic TTFT at 8,192 and 15,000 tokens with each (long_prompts).
#
#   bash benchmarks/device/r13_call_c.sh [LONG_PROMPTS_BUDGET_S]
source "$(dirname "$0")/session_preamble.sh"
BUDGET=${1:-110}
for gemm in cublas triton; do
    timeout 150 python3 benchmarks/device/profile_passes.py --model 8b --canonical-gemm "$gemm" --reps 10 \
        --out "$OUT/passes_8b_$gemm.json" >>"$LOG" 2>&1
    log "profile_passes 8b $gemm exit $?"
done
grep -E "^(verify|chunk|decode)" "$LOG" | tail -n 26
for gemm in cublas triton; do
    timeout $((BUDGET + 90)) python3 -m llm42.bench.long_prompts --device cuda --model 8b --lengths 8192,15000 \
        --reps 2 --budget-s "$BUDGET" --canonical-gemm "$gemm" --no-plots \
        --out "$OUT/long_prompts_8b_$gemm.json" >>"$LOG" 2>&1
    log "long_prompts $gemm exit $?"
done
python3 - "$OUT" <<'PY' 2>&1 | tee -a "$LOG"
import json, sys, pathlib
for gemm in ("cublas", "triton"):
    p = pathlib.Path(sys.argv[1]) / f"long_prompts_8b_{gemm}.json"
    if not p.exists():
        print(gemm, "missing"); continue
    d = json.loads(p.read_text())
    for row in d.get("ttft", []):
        print(gemm, json.dumps(row)[:400])
PY
log "done"
