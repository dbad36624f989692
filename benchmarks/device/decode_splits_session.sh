#!/usr/bin/env bash
# One device call: the fast decode attention kernel's time by split count (decode_splits_sweep.py), then
# the optional EXTRA command (issue 10).
#
#   bash benchmarks/device/decode_splits_session.sh       (OUT=... as the device tool sets it)
source "$(dirname "$0")/session_preamble.sh"
timeout ${SWEEP_S:-240} python3 benchmarks/device/decode_splits_sweep.py "$OUT/decode_splits_sweep.json" >>"$LOG" 2>&1
log "sweep exit $?"
if [ -n "${EXTRA:-}" ]; then eval "$EXTRA" >>"$LOG" 2>&1; log "extra exit $?"; fi
log "done"
