#!/usr/bin/env bash
# Round 44, device call C (right after call B on the warm machine: /root still holds the joined GGUF; or carry
# .dev_stage/b after stage_a.sh): windows closed at a risky draft (risk_margin=0.125, riding the next pass; round 24:
# 2.5 % recomputed offline against 11.2 %, the same offline throughput, never served online) on the configuration
# that met offline dvr@50 in round 43 (budget order, 32 SMs up to 1,024 rows), against it without: offline nondet and
# dvr@50, online at 0.7 load twice in ABBA order.
#
#   bash benchmarks/device/r44_call_c.sh
VARIANTS=${VARIANTS:-order_budget_sms_32_rows_1024,ride_budget_sms_32_rows_1024} MODES=${MODES:-nondet,dvr@50} \
    ONLINE_VARIANTS=${ONLINE_VARIANTS:-order_budget_sms_32_rows_1024,ride_budget_sms_32_rows_1024} \
    ONLINE_REPEATS=${ONLINE_REPEATS:-2} ROUND=r44 TAG=${TAG:-c} CAP=${CAP:-330} \
    exec bash "$(dirname "$0")/r42_call_b.sh"
