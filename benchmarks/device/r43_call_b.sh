#!/usr/bin/env bash
# Round 43, device call B (scripted in round 42; carry .dev_stage/b, at once after stage_a.sh carried
# .dev_stage/a; ran with CAP=540, benchmarks/results/h100_round43/call_b): can one configuration meet issue 10's
# online target and dvr@50's offline one together? Round 42 (an
# H100): the pass on 32 / 48 SMs kept free requests' online ITL within 1.15x of nondet at 0.61 / 0.67 of nondet
# offline for dvr@50; the budget order served dvr@50 at 0.845 with every SM. Real SmolLM2, 1,000 chat requests
# offline (nondet, dvr@10, dvr@50), then online at 0.7 load, 500 requests, nondet and dvr@50, twice in ABBA order;
# every online run lands in the JSON as it finishes (round 42's dvr_ab.py), with the deterministic requests'
# latencies. On an H200 when one comes (the targets name it).
#
#   bash benchmarks/device/r43_call_b.sh
VARIANTS=${VARIANTS:-default,order_budget,order_budget_sms_48,order_budget_sms_32} \
    ONLINE_VARIANTS=${ONLINE_VARIANTS:-default,order_budget_sms_48,order_budget_sms_32} ROUND=r43 \
    exec bash "$(dirname "$0")/r42_call_b.sh"
