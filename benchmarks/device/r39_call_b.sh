#!/usr/bin/env bash
# Round 39, device call B (carry .dev_stage/b, at once after stage_a.sh carried .dev_stage/a, or on the machine an
# earlier call B left warm): free requests' online ITL over nondet, real SmolLM2, for VARIANTS (default: the default
# against apply_before_read, to confirm round 39's first H100 run). Offline nondet and dvr@50 on 1,000 chat
# requests, then online at 0.7 load, 500 requests, nondet and dvr@50, each variant twice in ABBA order; ratios at the
# hand-over and at step return; every step's phases timed. TAG names the output files (several calls, one machine).
#
#   [VARIANTS=default,apply_before_read] [TAG=b] bash benchmarks/device/r39_call_b.sh
#   VARIANTS=apply_before_read,canon_priority,batched TAG=b2 bash benchmarks/device/r39_call_b.sh
ROUND=r39 VARIANTS=${VARIANTS:-default,apply_before_read} exec bash "$(dirname "$0")/r38_call_b.sh"
