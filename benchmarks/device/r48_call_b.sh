#!/usr/bin/env bash
# Round 48, device call B (carry .dev_stage/b, at once after r48_call_a.sh carried .dev_stage/a): the real SmolLM2
# (the default model) offline, 1,000 requests, nondet / dvr@10 / dvr@50, the fast decode attention's program order
# round 48 built ("order_head_longest": a sequence's kv heads adjacent, longest context first) against the grid
# before it ("order_seq"), in one process (the same bits either way: rollbacks differ by timing only).
#
#   bash benchmarks/device/r48_call_b.sh
export VARIANTS=${VARIANTS:-order_head_longest,order_seq} MODES=${MODES:-nondet,dvr@10,dvr@50} ONLINE_LOAD=${ONLINE_LOAD-}
export ROUND=r48 TAG=${TAG:-b} CAP=${CAP:-330} BUDGET=${BUDGET:-120}
source "$(dirname "$0")/r38_call_b.sh"
