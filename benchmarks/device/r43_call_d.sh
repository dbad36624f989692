#!/usr/bin/env bash
# Round 43, device call D (carry .dev_stage/b, at once after stage_a.sh carried .dev_stage/a): the pass confined to
# 32 SMs only up to a bound of rows (DVRGenerator(canonical_sms=32, canonical_sms_max_rows=...), new this round): does
# it keep the confined pass's online latency for free requests and give an offline backlog every SM? Real SmolLM2,
# 1,000 chat requests offline (nondet, dvr@50; MODES=nondet,dvr@10,dvr@50 adds dvr@10): the budget order with every
# SM (round 43 call B: dvr@50 0.839) and with passes up to 1,024 / 512 rows on 32 SMs; then online at 0.7 load,
# 500 requests, nondet and dvr@50, the 1,024-row variant against the budget order with every SM, once each (ABBA
# needs twice the time). Round 38's call script (through r42_call_b.sh); its env picks others.
#
#   bash benchmarks/device/r43_call_d.sh
VARIANTS=${VARIANTS:-order_budget,order_budget_sms_32_rows_1024,order_budget_sms_32_rows_512} \
    ONLINE_VARIANTS=${ONLINE_VARIANTS:-order_budget_sms_32_rows_1024,order_budget} \
    MODES=${MODES:-nondet,dvr@50} ONLINE_REPEATS=${ONLINE_REPEATS:-1} ROUND=r43 TAG=${TAG:-d} CAP=${CAP:-430} \
    exec bash "$(dirname "$0")/r42_call_b.sh"
