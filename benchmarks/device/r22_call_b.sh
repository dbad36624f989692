#!/usr/bin/env bash
# Round 22, device call B: the host functions behind a 15K prompt's idle device time (prefill_timeline.py
# --cprofile, free and deterministic), then deterministic 15K prompts with wider canonical passes (4,096 and
# 8,192 rows against the engine's 2,048).
#
#   bash benchmarks/device/r22_call_b.sh
source "$(dirname "$0")/session_preamble.sh"
timeout 200 python3 benchmarks/device/prefill_timeline.py --out "$OUT/timeline_15k_cprofile.json" --prompt 15000 \
    --reps 3 --cprofile >"$OUT/timeline_15k_cprofile.txt" 2>&1
log "timeline + cprofile exit $?"; grep -vE "Warning|warn|gap at" "$OUT/timeline_15k_cprofile.txt" | tail -n 80
for rows in 4096 8192; do
    timeout 150 python3 benchmarks/device/prefill_timeline.py --out "$OUT/timeline_15k_det_c$rows.json" \
        --prompt 15000 --reps 3 --modes det --max-canonical-tokens $rows >"$OUT/timeline_15k_det_c$rows.txt" 2>&1
    log "timeline det, $rows-row passes, exit $?"; grep -vE "Warning|warn|gap at" "$OUT/timeline_15k_det_c$rows.txt" | head -n 6
done
log "done"
