#!/usr/bin/env bash
# Round 33, device call B (carry .dev_stage/b, at once after a call that carried .dev_stage/a, e.g.
# `CAP=100 bash benchmarks/device/r32_call_a.sh`): SmolLM2 offline, 1,000 chat requests, nondet and dvr@50, ABBA in
# one process: the default, DefaultScheduler(order="budget") (round 32, one H100: 0.88 / 0.83 of nondet against the
# default's 0.65 / 0.68) and the same with admission="budget" (round 32's budget-order runs still ended on
# 1,024-token replies admitted last, K/V-limited, first token at 1-2 s). On an H200 if one is lent. Then, if the
# device time allows, admission by budget alone (the best pair of the CPU step model, cpu_order_admission.py):
#
#   bash benchmarks/device/r33_call_b.sh
#   VARIANTS=default,admit_budget,order_budget_admit bash benchmarks/device/r33_call_b.sh  # (no carry, at once)
VARIANTS=${VARIANTS:-default,order_budget,order_budget_admit} CAP=${CAP:-520} BUDGET=${BUDGET:-120} \
    exec bash "$(dirname "$0")/r31_call_b.sh"
