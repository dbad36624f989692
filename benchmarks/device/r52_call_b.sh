#!/usr/bin/env bash
# Round 52, device call B (carry .dev_stage/b, at once after two staging calls: r52_call_a.sh carrying
# .dev_stage/a, then `bash benchmarks/device/stage_a.sh` carrying .dev_stage/m). r51_call_e.sh's A/B: real
# SmolLM2 offline (1,000 chat requests, nondet and dvr@50), the lean Gumbel sweep (the default) against the plain
# one ("gumbel_plain"), REPEATS times in ABBA order, committed outputs compared.
#
#   [REPEATS=3] bash benchmarks/device/r52_call_b.sh
source "$(dirname "$0")/session_preamble.sh"
source "$(dirname "$0")/smollm2_env.sh"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv | tee -a "$LOG"
timeout "${CAP:-230}" python3 benchmarks/device/dvr_ab.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --variants default,gumbel_plain --modes nondet,dvr@50 --repeats "${REPEATS:-3}" --budget-s 60 \
    --warmup-requests 8 --warmup-modes dvr@50 --out "$OUT/dvr_ab_smollm2_lean_abba.json" >"$OUT/dvr_ab_smol.txt" 2>&1
log "smollm2 A/B exit $?"
grep -E "tok/s|median|identical|rror" "$OUT/dvr_ab_smol.txt" | grep -v warm-up | cut -c1-220 | tail -n 20
log "done"
