#!/usr/bin/env bash
# Round 57's first call (carry .dev_stage/a): the 8B shape, 1,000 requests, nondet, admission by budget, with the K/V
# store the card's memory gives (0.6 of the free memory: 247K positions on an H100, more than twice that on an H200)
# against fixed stores of 250K and 350K positions (on an H100: against at most 384 running requests). Round 35's H200
# ran the 8B shape's steps slower than an H100 (30.5 against 25 ms, the same 1,030 steps); round 49 measured a larger
# store slower on an H100 (it front-loads the rows, the last steps run thin). One process, one run each, under what is
# left of ONE_CAP seconds. VARIANTS, MODES (nondet) and REPEATS (1; ABBA) set the runs, TAG (store) the output files'
# names (dvr_ab_8b_$TAG.json / .txt).
#
#   [ONE_CAP=560] [VARIANTS=admit_budget,admit_budget_kv_250k,...] [MODES=nondet] [REPEATS=1] [TAG=store] \
#       bash benchmarks/device/r57_call_a.sh
source "$(dirname "$0")/session_preamble.sh"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv | tee -a "$LOG"
if [ -z "${VARIANTS:-}" ]; then  # an H100's own store is about 250K positions: it runs 384 seats instead
    VARIANTS=admit_budget,admit_budget_kv_250k,admit_budget_kv_350k
    nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || VARIANTS=admit_budget,admit_budget_seqs_384
fi
timeout "$(( $(left) - 5 ))" python3 benchmarks/device/dvr_ab.py --model 8b --lm-head-std 0.2 \
    --lm-head-bias-scale 26.9 --max-num-seqs 1024 --warmup-requests 0 --variants "$VARIANTS" \
    --modes "${MODES:-nondet}" --repeats "${REPEATS:-1}" --budget-s 100 --out "$OUT/dvr_ab_8b_${TAG:-store}.json" \
    >"$OUT/dvr_ab_8b_${TAG:-store}.txt" 2>&1
log "8b ${TAG:-store} exit $?"
grep -E "tok/s|K/V store|nondet$|dvr@|median|rror" "$OUT/dvr_ab_8b_${TAG:-store}.txt" | cut -c1-200 | tail -n 24
log "done"
