#!/usr/bin/env bash
# Round 14, device call E, right after r14_call_d.sh (carry .dev_stage/b): real SmolLM2, 1,000 chat requests offline
# at max_num_seqs 1,024 (nondet / dvr@10 / dvr@50), then online (Poisson at 0.7 x capacity, 500 requests, nondet and
# dvr@50): the default engine (split kernel for every decode row) against adaptive_draft=True (a deterministic
# request's draft depth halved after a rollback, doubled after a full accept: never measured on the H200 with the
# split kernel). Each run's budget share counts from its first request (dvr_ab.py, round 14).
#
#   bash benchmarks/device/r14_call_e.sh [BUDGET_S] [VARIANTS]
source "$(dirname "$0")/session_preamble.sh"
BUDGET=${1:-150}
VARIANTS=${2:-split_rows,adaptive}
source "$(dirname "$0")/smollm2_env.sh"
timeout 560 python3 benchmarks/device/dvr_ab.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --variants "$VARIANTS" --budget-s "$BUDGET" --warmup-requests 16 --warmup-modes dvr@50 \
    --online-load 0.7 --online-modes nondet,dvr@50 --online-requests 500 --online-budget-s 80 \
    --out "$OUT/dvr_ab_smollm2_r14_e.json" >>"$LOG" 2>&1
log "dvr_ab ($VARIANTS) exit $?"
grep "^\[dvr_ab\]" "$LOG" | grep -v warm-up | tail -n 30
log "done"
