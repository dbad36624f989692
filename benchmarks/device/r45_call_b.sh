#!/usr/bin/env bash
# Round 45, device call B (carry .dev_stage/b, at once after stage_a.sh carried .dev_stage/a): issue 10's SmolLM2
# figures for the default since round 44 (order="canonical_budget") against arrival order (rounds 1-43's default) in
# one process: real SmolLM2, 1,000 chat requests offline, nondet / dvr@10 / dvr@50 (round 44 measured dvr@50 only),
# then online at 0.7 load, 500 requests, nondet and dvr@50, twice in ABBA order (round 44 ran the new default online
# once, on another machine: 1.15x / 1.22x).
#
#   bash benchmarks/device/r45_call_b.sh
VARIANTS=${VARIANTS:-default,order_arrival} MODES=${MODES:-nondet,dvr@10,dvr@50} \
    ONLINE_VARIANTS=${ONLINE_VARIANTS:-default,order_arrival} ONLINE_REPEATS=${ONLINE_REPEATS:-2} \
    ROUND=r45 TAG=${TAG:-b} CAP=${CAP:-560} exec bash "$(dirname "$0")/r42_call_b.sh"
