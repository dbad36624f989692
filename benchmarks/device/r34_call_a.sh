#!/usr/bin/env bash
# Round 34, device call A (no carry): the 8B shape with the calibrated head, 1,000 requests, nondet and dvr@10, the
# default against admission by budget (`admit_budget`: DefaultScheduler(admission="budget")). Round 33's complete
# 8B run on an H100 (call A3: order_budget, nondet 5,261 tok/s, dvr@10 x1.023) ended on request 998, a 1,024-token
# reply admitted at 25.2 s of 54.0 s: the benchmark's K/V store (60 % of the memory free after the weights) holds
# about half the set on an 80 GB card. The CPU step model (benchmarks/cpu_admission_kv.py) puts admission by budget
# at 0.79-0.86x the steps at 570K / 400K K/V positions. Each run needs ~55 s on an H100 (~25 s on an H200): the
# budget is 70 s a run; a run cut by it says so (is_complete).
#
#   bash benchmarks/device/r34_call_a.sh
VARIANTS=${VARIANTS:-default,admit_budget} REPEATS=${REPEATS:-1} BUDGET=${BUDGET:-280} CAP=${CAP:-480} NAME=r34_a \
    exec bash "$(dirname "$0")/r33_call_a.sh"
