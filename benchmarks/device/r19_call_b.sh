#!/usr/bin/env bash
# Round 19, device call B: the GPU tests that the full-block step keeps the masked step's bits (call A's run was cut
# before them); what a long prompt's attention can run at (attention_ceiling.py: the engine's kernel, a minimal
# dense Triton kernel, PyTorch's backends); the 15K prompt's chunks at pages of 16 (gathers) and 64 (TMA).
#
#   bash benchmarks/device/r19_call_b.sh
source "$(dirname "$0")/session_preamble.sh"
timeout 120 python3 -m pytest -v -p no:cacheprovider tests/gpu/test_tiled_attention.py -k "unmasked_full_blocks" \
    >"$OUT/gpu_tests_b.txt" 2>&1
log "gpu tests exit $? ($(tail -n 1 "$OUT/gpu_tests_b.txt"))"
grep -E "PASSED|FAILED|ERROR" "$OUT/gpu_tests_b.txt" | tail -n 20
timeout 200 python3 benchmarks/device/attention_ceiling.py --out "$OUT/attention_ceiling.json" \
    --lengths 8192,15000 --reps 5 >"$OUT/attention_ceiling.txt" 2>&1
log "attention ceiling exit $?"
cat "$OUT/attention_ceiling.txt" | tail -n 40
timeout 90 python3 benchmarks/device/prefill_chunk_attention.py --out "$OUT/prefill_chunks_tma_15k.json" \
    --lengths 15000 --layouts 16:gather,64:tma --configs default --reps 5 >"$OUT/prefill_chunks_tma_15k.txt" 2>&1
log "prefill chunks 15K exit $?"
cat "$OUT/prefill_chunks_tma_15k.txt" | tail -n 10
log "done"
