#!/usr/bin/env bash
# Round 36, device call A (carries .dev_stage/a, copied to /root for the SmolLM2 call right after): does a fast step
# share the device with a canonical pass, or wait for it? profile_passes.py --beside on the SmolLM2 shape: a decode
# step of 64 / 128 rows and a pass of 1 / 4 / 8 / 64 windows (or a 512-row prompt chunk), each alone, then side by side
# on two streams in both orders; and the fused alternative, one pass carrying the windows and the decode rows as
# one-row segments. Rounds 34-35 found the slowest free gaps in steps beside a pass (read-back waits 1.4-1.5 ms after
# 2.4-2.8 ms of host work) and inferred, from the host's clock only, that the two serialise on the device.
#
#   bash benchmarks/device/r36_call_a.sh
source "$(dirname "$0")/session_preamble.sh"
timeout "${PROFILE_CAP:-150}" python3 benchmarks/device/profile_passes.py --model smollm2 --beside \
    --out "$OUT/passes_beside_smollm2.json" >"$OUT/passes_beside.txt" 2>&1
log "profile_passes --beside exit $?"; grep -E "^beside|^NVIDIA|^verify|^chunk|^decode|rror" "$OUT/passes_beside.txt" | tail -n 40
log "done"
