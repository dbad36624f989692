#!/usr/bin/env bash
# Next device call B (carry .dev_stage/b, at once after r51_call_a.sh carried .dev_stage/a): the real SmolLM2
# offline (nondet / dvr@10 / dvr@50) with the Gumbel sweep skipping greedy rows and split over ~1,024 programs
# ("gumbel_lean") against the default, one process, and online at 0.7 load (two repeats) under the default,
# whose free ITL ratio round 50 measured only before the fused sampler (1.18x / 1.16-1.21x).
#
#   bash benchmarks/device/r51_call_b.sh
export VARIANTS=${VARIANTS:-default,gumbel_lean} MODES=${MODES:-nondet,dvr@10,dvr@50}
export ONLINE_VARIANTS=${ONLINE_VARIANTS:-default} ONLINE_REPEATS=${ONLINE_REPEATS:-2}
export ROUND=r51 TAG=${TAG:-b} CAP=${CAP:-480} BUDGET=${BUDGET:-60}
source "$(dirname "$0")/r38_call_b.sh"
