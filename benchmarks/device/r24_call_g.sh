#!/usr/bin/env bash
# Round 24, device call G (carries .dev_stage/a): the SmolLM2 stage's first half to /root (call F's machine was
# taken back before it finished; this and call H are what the session's device time left allowed).
#
#   bash benchmarks/device/r24_call_g.sh
source "$(dirname "$0")/session_preamble.sh"
log "done"
