#!/usr/bin/env bash
# Round 44, device call D (carry .dev_stage/b, at once after stage_a.sh carried .dev_stage/a): is the budget order's
# offline dvr@50 gain (round 44 call B: 0.846 against 0.756, the same process) the canonical pass's? Real SmolLM2,
# 1,000 chat requests offline, nondet and dvr@50: the default (arrival), order="budget" and order="canonical_budget"
# (budget order for the pass's rows, arrival for the fast step's: nondet served as by arrival); then online at 0.7
# load, the default against canonical_budget, once.
#
#   bash benchmarks/device/r44_call_d.sh
VARIANTS=${VARIANTS:-default,order_budget,order_canonical_budget} MODES=${MODES:-nondet,dvr@50} \
    ONLINE_VARIANTS=${ONLINE_VARIANTS:-default,order_canonical_budget} ONLINE_REPEATS=${ONLINE_REPEATS:-1} \
    ROUND=r44 TAG=${TAG:-d} CAP=${CAP:-300} exec bash "$(dirname "$0")/r42_call_b.sh"
