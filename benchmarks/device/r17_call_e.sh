#!/usr/bin/env bash
# Round 17, device call E: after call C (the narrow decode tile passed its bit tests, but its row-selecting build
# failed the deterministic-rows tests), launches with only_rows keep the wide tile: those tests again, then the
# staged timings of tile_m_bits.py alone (call C's ran out of time in the bit comparisons).
#
#   bash benchmarks/device/r17_call_e.sh
source "$(dirname "$0")/session_preamble.sh"
timeout 170 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_tiled_attention.py \
    -k "decode_launch or deterministic_rows or routes_deterministic" >"$OUT/gpu_tests_e.txt" 2>&1
log "gpu tests exit $? ($(tail -n 1 "$OUT/gpu_tests_e.txt"))"
timeout 200 python3 benchmarks/device/tile_m_bits.py --timings-only --out "$OUT/tile_m_timings_e.json" \
    >"$OUT/tile_m_timings_e.txt" 2>&1
log "tile_m_bits --timings-only exit $?"
cat "$OUT/tile_m_timings_e.txt" | tail -n 12
log "done"
