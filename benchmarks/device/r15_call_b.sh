#!/usr/bin/env bash
# Round 15, device call B, right after r15_call_a.sh (carry .dev_stage/b): real SmolLM2, 1,000 chat requests
# offline at max_num_seqs 1,024 (nondet / dvr@10 / dvr@50), then online (Poisson at 0.7 x capacity, 500 requests,
# nondet and dvr@50): the round-15 default (a wide pass's GEMM blocks on 4 streams, tile tables) against round 14's
# canonical pass (blocks in turn, the fixed tiling) and the blocks in turn alone. Each run's budget share counts
# from its first request.
#
#   bash benchmarks/device/r15_call_b.sh [BUDGET_S] [VARIANTS]
source "$(dirname "$0")/session_preamble.sh"
BUDGET=${1:-180}
VARIANTS=${2:-default,round14_pass,serial_gemm}
source "$(dirname "$0")/smollm2_env.sh"
timeout 570 python3 benchmarks/device/dvr_ab.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --variants "$VARIANTS" --budget-s "$BUDGET" --warmup-requests 16 --warmup-modes dvr@50 \
    --online-load 0.7 --online-modes nondet,dvr@50 --online-requests 500 --online-budget-s 90 \
    --out "$OUT/dvr_ab_smollm2_r15_b.json" >>"$LOG" 2>&1
log "dvr_ab ($VARIANTS) exit $?"
grep "^\[dvr_ab\]" "$LOG" | grep -v warm-up | tail -n 30
log "done"
