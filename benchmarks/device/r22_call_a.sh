#!/usr/bin/env bash
# Round 22, device call A: the fused RoPE kernel's GPU tests and its row-program launch against the (row, head)
# launch (rope_bench.py); then where a 15K prompt's TTFT goes that no kernel takes (prefill_timeline.py, 8B shape,
# the long-prompt canonical config, free and deterministic).
#
#   bash benchmarks/device/r22_call_a.sh
source "$(dirname "$0")/session_preamble.sh"
timeout 120 python3 -m pytest -q -m gpu tests/gpu/test_fused.py -p no:cacheprovider >"$OUT/gpu_tests_a.txt" 2>&1
log "gpu tests (fused) exit $?"; tail -n 3 "$OUT/gpu_tests_a.txt"
timeout 60 python3 benchmarks/device/rope_bench.py --out "$OUT/rope_bench.json" >"$OUT/rope_bench.txt" 2>&1
log "rope bench exit $?"; cat "$OUT/rope_bench.txt" | grep -v Warn | tail -n 8
timeout 300 python3 benchmarks/device/prefill_timeline.py --out "$OUT/timeline_15k.json" --prompt 15000 --reps 3 \
    >"$OUT/timeline_15k.txt" 2>&1
log "timeline exit $?"; grep -vE "Warning|warn" "$OUT/timeline_15k.txt" | tail -n 80
log "done"
