#!/usr/bin/env bash
# Round 19, device call C: does a K/V load that waits on a block-table load hold the attention back?
# attention_ceiling.py --configs short: the engine kernel, the minimal dense kernel, the same kernel over the paged
# cache with the page ids loaded in the iteration or one iteration ahead.
#
#   bash benchmarks/device/r19_call_c.sh
source "$(dirname "$0")/session_preamble.sh"
timeout 200 python3 benchmarks/device/attention_ceiling.py --out "$OUT/attention_ceiling_paged.json" \
    --lengths 8192,15000 --reps 5 --configs short >"$OUT/attention_ceiling_paged.txt" 2>&1
log "attention ceiling exit $?"
grep -E "^L=|n_regs" "$OUT/attention_ceiling_paged.txt" | tail -n 40
log "done"
