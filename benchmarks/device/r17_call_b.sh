#!/usr/bin/env bash
# Round 17, device call B: the canonical tiled attention's tile height and warps against a row's bits (every row
# of decode batches, verify windows and a prompt chunk, four head shapes, bf16 and fp16, the split kernel as the
# control), and what each height costs for decode rows (one per tile, against the split-KV kernel) and a chunk.
#
#   bash benchmarks/device/r17_call_b.sh
source "$(dirname "$0")/session_preamble.sh"
timeout 400 python3 benchmarks/device/tile_m_bits.py --out "$OUT/tile_m_bits.json" >"$OUT/tile_m_bits.txt" 2>&1
log "tile_m_bits exit $?"
tail -n 40 "$OUT/tile_m_bits.txt"
log "done"
