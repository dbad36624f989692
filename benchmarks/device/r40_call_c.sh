#!/usr/bin/env bash
# Round 40, device call C (carry .dev_stage/b, at once after stage_a.sh carried .dev_stage/a): how many of dvr@50's
# online passes carry a deterministic prompt's chunk (stats["prompt_passes"], new this round), real SmolLM2, the
# default engine: offline nondet (1,000 chat requests: the capacity), then online dvr@50 at 0.7 load, 500 requests,
# once (call B's workload), and offline dvr@50 for the same split there.
#
#   bash benchmarks/device/r40_call_c.sh
source "$(dirname "$0")/session_preamble.sh"
source "$(dirname "$0")/smollm2_env.sh"
timeout "${CAP:-150}" python3 benchmarks/device/dvr_ab.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --variants default --modes nondet,dvr@50 --budget-s 40 --warmup-requests 4 --warmup-modes dvr@50 \
    --online-load 0.7 --online-modes dvr@50 --online-requests 500 --online-budget-s 40 \
    --out "$OUT/dvr_ab_smollm2_r40_c.json" >"$OUT/dvr_ab_c.txt" 2>&1
log "dvr_ab exit $?"
python3 - "$OUT/dvr_ab_smollm2_r40_c.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for mode, r in d.get("runs", {}).get("default", {}).items():
    print("offline", mode, r.get("canonical_passes"), "passes,", r.get("prompt_passes"), "with prompts")
for mode, r in d.get("online", {}).get("runs", {}).get("default", {}).items():
    print("online", mode, r.get("canonical_passes"), "passes,", r.get("prompt_passes"), "with prompts")
PY
log "done"
