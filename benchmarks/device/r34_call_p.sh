#!/usr/bin/env bash
# Round 34, device call P: where a canonical pass's launch spends its host time. Round 34's call B (the online
# diagnosis) found the slowest 1 % of free gaps all span steps that both apply a pass and launch the next: those
# steps' step() takes 4.27 ms at the median against 1.46 ms for plain steps (launch alone 2.89, apply alone 1.86).
# profile_passes.py on the SmolLM2 shape (random weights, context 600, graphs): per pass the host ms of stage,
# launch until it returns and the graph replays alone, and a cProfile of the 8- and 64-window launches.
#
#   bash benchmarks/device/r34_call_p.sh
source "$(dirname "$0")/session_preamble.sh"
timeout "${CAP:-150}" python3 benchmarks/device/profile_passes.py --model smollm2 --host-profile \
    --out "$OUT/passes_host_smollm2.json" >"$OUT/passes_host.txt" 2>&1
log "profile_passes exit $?"
tail -n 20 "$OUT/passes_host.txt"
log "done"
