#!/usr/bin/env bash
# Round 44, device call B (carry .dev_stage/b, at once after stage_a.sh carried .dev_stage/a): round 43 measured
# canonical_sms_max_rows once per configuration (one H100): with the default order, 32 SMs up to 1,024 rows gave
# online free ITL p50 / p99 1.14x / 1.20x at offline dvr@50 0.752; with the budget order 0.811 offline at 1.20x online;
# every SM (the default) 1.28x / 1.54x on another machine, the budget order with every SM 0.841 / 1.21x / 1.16x. This
# call serves the four on one machine: offline nondet
# and dvr@50 for each, then online in ABBA order twice, with round 44's gap classes (a pass still running beside a
# gap, the fast tokens its step read: free_gap_attribution's ``running`` and ``fast_tokens``).
#
#   bash benchmarks/device/r44_call_b.sh
VARIANTS=${VARIANTS:-default,order_budget,sms_32_rows_1024,order_budget_sms_32_rows_1024} MODES=${MODES:-nondet,dvr@50} \
    ONLINE_VARIANTS=${ONLINE_VARIANTS:-default,order_budget,sms_32_rows_1024,order_budget_sms_32_rows_1024} \
    ONLINE_REPEATS=${ONLINE_REPEATS:-2} ROUND=r44 TAG=${TAG:-b} CAP=${CAP:-570} \
    exec bash "$(dirname "$0")/r42_call_b.sh"
