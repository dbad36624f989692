#!/usr/bin/env bash
# Round 35, device call C (no carry): the 8B shape with the calibrated head, admission by budget alone against
# admission and service by budget (DefaultScheduler(order="budget", admission="budget")). Round 34 (an H100):
# admission by budget served nondet at 10,825 tok/s against 7,972 by arrival, but its dvr@10 (8,911 tok/s, 0.823 of
# its own nondet) ended on deterministic request 92, a 1,024-token reply with 15 rollbacks done at 31.9 s against
# nondet's 26.2 s; the budget order serves the largest budgets' windows first (round 33: dvr@10 1.023x by itself).
#
#   bash benchmarks/device/r35_call_c.sh
VARIANTS=${VARIANTS:-admit_budget,order_budget_admit} REPEATS=${REPEATS:-1} BUDGET=${BUDGET:-280} CAP=${CAP:-400} \
    NAME=r35_c exec bash "$(dirname "$0")/r33_call_a.sh"
