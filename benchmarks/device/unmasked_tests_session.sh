#!/usr/bin/env bash
# One device call: the GPU suite's checks of the canonical launch with unmasked full key blocks (issue 12),
# then canonical_config_sweep.py at 15,000 and 32,768 keys for the current tile and 128-row tiles.
#
#   bash benchmarks/device/unmasked_tests_session.sh       (OUT=... as the device tool sets it)
#
# Copies .dev_stage/a/part_a to /root when it was carried (the SmolLM2 stage for the next call).
source "$(dirname "$0")/session_preamble.sh"
timeout 200 python3 -m pytest -v -p no:cacheprovider -m gpu --durations=8 tests/gpu/test_tiled_attention.py \
    -k "(unmasked or row_bits or kv_does_not or canonical_pass_row_bits or decode_launch) and not float64" \
    >"$OUT/gpu_tests_unmasked.txt" 2>&1
log "tests exit $?"
tail -n 4 "$OUT/gpu_tests_unmasked.txt" >>"$LOG"
timeout 110 python3 benchmarks/device/canonical_config_sweep.py "$OUT/canonical_config_sweep_long.json" \
    --lengths 15000,32768 --reps 8 --configs 64x64x4x2,128x64x4x2 >"$OUT/sweep_long_log.txt" 2>&1
log "sweep exit $?"
log "done"
