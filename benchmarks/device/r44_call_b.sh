#!/usr/bin/env bash
# Next device call (scripted in round 43, not run; carry .dev_stage/b, at once after stage_a.sh carried
# .dev_stage/a): round 43 measured canonical_sms_max_rows once per configuration (one H100): with the default order,
# 32 SMs up to 1,024 rows gave online free ITL p50 / p99 1.14x / 1.20x at offline dvr@50 0.752; with the budget order
# 0.811 offline at 1.20x online. This call repeats the online comparison in ABBA order on one machine (the default
# order: passes up to 1,024 rows on 32 SMs, every pass on 32 SMs, and 48 SMs up to 1,024 rows), offline nondet and
# dvr@50 for each, on an H200 if one comes (the targets name it).
#
#   bash benchmarks/device/r44_call_b.sh
VARIANTS=${VARIANTS:-sms_32_rows_1024,sms_32,sms_48_rows_1024} MODES=${MODES:-nondet,dvr@50} \
    ONLINE_VARIANTS=${ONLINE_VARIANTS:-sms_32_rows_1024,sms_32,sms_48_rows_1024} ONLINE_REPEATS=${ONLINE_REPEATS:-2} \
    ROUND=r44 TAG=${TAG:-b} CAP=${CAP:-560} exec bash "$(dirname "$0")/r42_call_b.sh"
