#!/usr/bin/env bash
# Round 42, device call B (carry .dev_stage/b, at once after stage_a.sh carried .dev_stage/a): issue 10's SmolLM2
# figures at this tree on whichever card the call gets (the targets name an H200): real SmolLM2, 1,000 chat requests
# offline, nondet / dvr@10 / dvr@50, the default scheduler and DefaultScheduler(order="budget") (each against the
# first variant's nondet and its own), and the pass on a green context of 96 or 64 SMs (canonical_sms; round 40: 96 SMs
# gave the best single p50 at the hand-over, within the spread); then online at 0.7 x the default's nondet capacity,
# 500 requests, nondet and dvr@50, the default against the two green contexts, twice in ABBA order, free requests'
# ITL at the hand-over. Round 38's call script with these runs (its VARIANTS, MODES, ONLINE_VARIANTS, ONLINE_REQUESTS,
# ONLINE_BUDGET, ONLINE_REPEATS, BUDGET, CAP, TAG pick others; ROUND names the JSON, r43_call_b.sh sets it).
#
#   bash benchmarks/device/r42_call_b.sh
VARIANTS=${VARIANTS:-default,order_budget,sms_96,sms_64} MODES=${MODES:-nondet,dvr@10,dvr@50} BUDGET=${BUDGET:-160} \
    ONLINE_VARIANTS=${ONLINE_VARIANTS:-default,sms_96,sms_64} ONLINE_BUDGET=${ONLINE_BUDGET:-300} \
    ROUND=${ROUND:-r42} exec bash "$(dirname "$0")/r38_call_b.sh"
