#!/usr/bin/env bash
# Round 20, device call F: where a 15,000-token prompt's device time goes, deterministic (canonical passes of 2,048
# rows, the long-prompt config) against free (the fast path), kernel classes under torch.profiler (eager).
#
#   bash benchmarks/device/r20_call_f.sh
source "$(dirname "$0")/session_preamble.sh"
timeout 200 python3 benchmarks/device/profile_canonical_prefill.py --out "$OUT/profile_15k_det_free.json" \
    --prompt 15000 --groups 64 --modes det,free --canonical-gemm triton --canonical-tile-m 128 --block-size 16 \
    >"$OUT/profile_15k_det_free.txt" 2>&1
log "profile exit $?"
grep -v "^USDT" "$OUT/profile_15k_det_free.txt" | tail -n 40
log "done"
