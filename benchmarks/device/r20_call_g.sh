#!/usr/bin/env bash
# Round 20, device call G: the canonical Triton GEMM's loop options (flatten, warp specialisation) on the 8B shape's
# pinned TMA tiles: time and bits against the pinned launch, cuBLAS beside them.
#
#   bash benchmarks/device/r20_call_g.sh
source "$(dirname "$0")/session_preamble.sh"
timeout 150 python3 benchmarks/device/gemm_loop_options.py --out "$OUT/gemm_loop_options.json" --rows 2048,256 \
    >"$OUT/gemm_loop_options.txt" 2>&1
log "gemm loop options exit $?"
grep -v "^  " "$OUT/gemm_loop_options.txt" | tail -n 30
log "done"
