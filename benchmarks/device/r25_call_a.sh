#!/usr/bin/env bash
# Round 25, device call A (carries .dev_stage/a): the canonical GEMM's tiles for SmolLM2's shapes timed inside CUDA
# graphs (gemm_graph_sweep.py; its pins to /root/pins.json for call B), then one canonical pass of each shape with
# the default canonical GEMM (cuBLAS on 256-row blocks) beside the Triton GEMM, with the tree's pins and with the
# sweep's (pass_ab.py, two processes).
#
#   bash benchmarks/device/r25_call_a.sh
source "$(dirname "$0")/session_preamble.sh"
timeout 200 python3 benchmarks/device/gemm_graph_sweep.py --model smollm2 --out "$OUT/gemm_graph_sweep.json" \
    --pins-out "$OUT/pins.json" >"$OUT/gemm_graph_sweep.txt" 2>&1
log "sweep exit $?"; cat "$OUT/gemm_graph_sweep.txt"
[ -f "$OUT/pins.json" ] && cp "$OUT/pins.json" /root/pins.json
timeout 120 python3 benchmarks/device/pass_ab.py --model smollm2 --variants serial_tiles,triton \
    --out "$OUT/pass_ab_tree_pins.json" >"$OUT/pass_ab.txt" 2>&1
log "pass_ab (tree's pins) exit $?"
if [ -f "$OUT/pins.json" ]; then
    timeout 120 python3 benchmarks/device/with_pins.py "$OUT/pins.json" benchmarks/device/pass_ab.py --model smollm2 \
        --variants serial_tiles,triton --out "$OUT/pass_ab_swept_pins.json" >>"$OUT/pass_ab.txt" 2>&1
    log "pass_ab (swept pins) exit $?"
fi
cat "$OUT/pass_ab.txt" | grep -v "^\s*$" | tail -n 30
log "done"
