#!/usr/bin/env bash
# Round 45, device call C (no carry): the 8B shape (calibrated head, 1,000 requests) on whichever card comes. Issue 10
# asks 14K tok/s nondet of one H200; round 17's H200 served 11.1K-11.4K at 512-768 sequences by arrival, round 35's
# 8.2K by arrival and 9.0K with admission by budget at 1,024 sequences (28.8-30.5 ms a step against round 17's ~19-21:
# not investigated), round 34's H100 10.8K with admission by budget. Here, one process per sequence cap: 512
# sequences, the default (order="canonical_budget" since round 44) and admission by budget, nondet and dvr@10 (the
# default's 8B dvr@10 not measured since the order changed); then 1,024 sequences, nondet only, the same two.
# BUDGET: each process's --budget-s, shared by its runs (round 45 ran 120: on its H100 the 512-sequence process's
# first run, ~31 s, was cut by its 30 s share; 240 by default since).
#
#   bash benchmarks/device/r45_call_c.sh
source "$(dirname "$0")/session_preamble.sh"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv | tee -a "$LOG"
run_8b() {  # $1 max_num_seqs, $2 modes, $3 cap (s)
    timeout "$3" python3 benchmarks/device/dvr_ab.py --model 8b --variants "${VARIANTS:-default,admit_budget}" \
        --modes "$2" --lm-head-std 0.2 --lm-head-bias-scale 26.9 --max-num-seqs "$1" --budget-s "${BUDGET:-240}" \
        --warmup-requests 8 --warmup-modes "${2##*,}" --out "$OUT/dvr_ab_8b_r45_c_$1.json" >"$OUT/dvr_ab_8b_c_$1.txt" 2>&1
    log "dvr_ab 8b seqs $1 exit $?"
    grep -E "^\[dvr_ab\]|rror" "$OUT/dvr_ab_8b_c_$1.txt" | grep -E "tok/s|warm-up|rror|identical" | cut -c1-200
}
run_8b 512 nondet,dvr@10 "${CAP_512:-360}"
run_8b 1024 nondet "${CAP_1024:-200}"
log "done"
