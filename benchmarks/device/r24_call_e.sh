#!/usr/bin/env bash
# Round 24, device call E (carries .dev_stage/a): call C's run (the risk-margin GPU test, the SmolLM2 stage's first
# half to /root) on the tree with risky windows riding the next pass (DefaultScheduler(risky_windows="ride"), the
# default since calls B-D); its files are named *_e.
#
#   bash benchmarks/device/r24_call_e.sh
CALL=e exec bash "$(dirname "$0")/r24_call_c.sh"
