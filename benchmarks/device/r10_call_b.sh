#!/usr/bin/env bash
# Round 10, device call B (issue 10), right after a call that copied .dev_stage/a/part_a to /root (it carries
# .dev_stage/b): the real SmolLM2-135M-Instruct, 1,000 chat requests offline at max_num_seqs 1,024, nondet /
# dvr@10 / dvr@50 with the engine's CUDA defaults; then 500 of them online (Poisson arrivals at 0.7 x the
# offline nondet capacity), nondet and dvr@50 (free requests' ITL ratio); then one dvr@50 run under cProfile
# (where the host's time goes), all in one process (benchmarks/device/dvr_ab.py).
#
#   bash benchmarks/device/r10_call_b.sh [BUDGET_S] [ONLINE_S] [PROFILE_S] [VARIANTS] [NAME]
source "$(dirname "$0")/session_preamble.sh"
BUDGET=${1:-150}
ONLINE=${2:-120}
PROFILE=${3:-60}
VARIANTS=${4:-default}
NAME=${5:-dvr_ab_smollm2_online_profile}
source "$(dirname "$0")/smollm2_env.sh"
timeout $((BUDGET + ONLINE + PROFILE + 120)) python3 benchmarks/device/dvr_ab.py --model "$SMOL" \
    --cache-dir /tmp/llm42_models --variants "$VARIANTS" --budget-s "$BUDGET" --online-load 0.7 \
    --online-budget-s "$ONLINE" --profile-mode dvr@50 --profile-budget-s "$PROFILE" \
    --out "$OUT/$NAME.json" >>"$LOG" 2>&1
log "dvr_ab exit $?"
grep "^\[dvr_ab\]\|num_checked" "$LOG" | tail -n 24
log "done"
