#!/usr/bin/env bash
# Round 50, device call D (carry .dev_stage/b, at once after r50_call_c.sh carried .dev_stage/a): the real SmolLM2
# (the default model) offline, 1,000 requests, nondet / dvr@10 / dvr@50, with the fused CUDA sampler (the default
# since round 50) against the torch ops on a float32 copy ("sampler_unfused"), in one process (the same bits
# either way: committed outputs are compared).
#
#   bash benchmarks/device/r50_call_d.sh
export VARIANTS=${VARIANTS:-default,sampler_unfused} MODES=${MODES:-nondet,dvr@10,dvr@50} ONLINE_LOAD=${ONLINE_LOAD-}
export ROUND=r50 TAG=${TAG:-d} CAP=${CAP:-230} BUDGET=${BUDGET:-60}
source "$(dirname "$0")/r38_call_b.sh"
