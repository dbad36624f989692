#!/usr/bin/env bash
# Round 17, device call C (carried .dev_stage/a for a call D that never ran): the canonical decode launch in
# its narrow one-row tile (CANONICAL_DECODE_TILE): the GPU tests of the tiled kernels' decode launches (bits against
# the canonical launch at model shapes, bf16 and fp16, the negative control; deterministic rows; the contract with
# each fast decode kernel), then tile_m_bits.py: more tile/stage variants' bits and the staged timings.
#
#   bash benchmarks/device/r17_call_c.sh
source "$(dirname "$0")/session_preamble.sh"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_tiled_attention.py \
    -k "decode_launch or deterministic_rows or routes_deterministic or canonical_decode_kernel" \
    >"$OUT/gpu_tests_c.txt" 2>&1
log "gpu tests exit $? ($(tail -n 1 "$OUT/gpu_tests_c.txt"))"
timeout 300 python3 benchmarks/device/tile_m_bits.py --out "$OUT/tile_m_bits_c.json" >"$OUT/tile_m_bits_c.txt" 2>&1
log "tile_m_bits exit $?"
grep -E "^(decode|chunk)/|differing|m16w1" "$OUT/tile_m_bits_c.txt" | tail -n 40
log "done"
