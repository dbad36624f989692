#!/usr/bin/env bash
# Round 39, device call P (carry .dev_stage/b, at once after stage_a.sh): where a dvr@50 step's host time goes on a
# GPU host. Real SmolLM2, offline nondet and dvr@50 (1,000 chat requests), then one more dvr@50 run under cProfile
# (dvr_ab.py --profile-mode: the host's own and cumulative time by function, top 90 of each; since round 40 the
# profiler is on for the whole run, and the callees of the step's phases are listed too, dvr_ab.PROFILE_CALLEES).
#
#   [ROUND=r40] [VARIANTS=default] bash benchmarks/device/r39_call_p.sh
source "$(dirname "$0")/session_preamble.sh"
source "$(dirname "$0")/smollm2_env.sh"
ROUND=${ROUND:-r39}
timeout "${CAP:-300}" python3 benchmarks/device/dvr_ab.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --variants "${VARIANTS:-default}" --modes nondet,dvr@50 --budget-s 90 --warmup-requests 8 --warmup-modes dvr@50 \
    --profile-mode dvr@50 --profile-budget-s 40 --out "$OUT/dvr_ab_profile_$ROUND.json" >"$OUT/dvr_ab_p.txt" 2>&1
log "dvr_ab exit $?"
grep -E "^\[dvr_ab\]|rror" "$OUT/dvr_ab_p.txt" | grep -E "tok/s|rror" | tail -n 8
python3 - "$OUT/dvr_ab_profile_$ROUND.json" <<'PY' | tee "$OUT/host_profile.txt" | head -n 150
import json, sys
d = json.load(open(sys.argv[1]))
for v, p in d.get("host_profile", {}).items():
    if v == "mode":
        continue
    print(v, {k: p[k] for k in ("is_complete", "steps", "elapsed_s", "output_tokens_per_s")})
    print("\n".join(p["by_cumulative"][:110]))
    print("\n".join(p["by_tottime"][:60]))
    for lines in p.get("callees", {}).values():
        print("\n".join(lines))
PY
log "done"
