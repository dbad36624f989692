#!/usr/bin/env bash
# Device call C (no carry; after r55_call_one.sh). The top-k / top-p threshold's kernel (round 55) on the 8B shape
# served: nondet, admission by budget, the default (the kernel) against the torch filter (admit_budget_torch_filter,
# as before round 55: a sort and float64 sums over every row of a step with a filtered row), with 10 of the 1,000
# requests asking for top_p = 0.9, then with 400 (most of the sampled half: nearly every step filters most of its
# sampled rows); no warm-up runs (each build captures every graph).
#
#   bash benchmarks/device/r55_call_c.sh
source "$(dirname "$0")/session_preamble.sh"
ARGS="--model 8b --lm-head-std 0.2 --lm-head-bias-scale 26.9 --max-num-seqs 1024 --warmup-requests 0"
for n in 10 400; do
    # shellcheck disable=SC2086  # ARGS is a list of options
    timeout "${TOP_P_CAP:-280}" python3 benchmarks/device/dvr_ab.py $ARGS \
        --variants admit_budget,admit_budget_torch_filter --modes nondet --repeats 1 --budget-s 110 \
        --top-p-requests "$n" --out "$OUT/dvr_ab_8b_top_p_$n.json" >"$OUT/dvr_ab_8b_top_p_$n.txt" 2>&1
    log "8b top-p $n exit $?"; grep -E "tok/s|median|note" "$OUT/dvr_ab_8b_top_p_$n.txt" | cut -c1-200 | tail -n 8
done
log "done"
