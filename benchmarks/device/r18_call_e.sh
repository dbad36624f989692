#!/usr/bin/env bash
# Round 18, device call E: regression GPU tests for the kernels and policies round 18 touched at their default tile
# height (the chunked kernel and the decode launches now take tile_m; the engine's CUDA tests on the default config).
#
#   bash benchmarks/device/r18_call_e.sh
source "$(dirname "$0")/session_preamble.sh"
timeout 150 python3 -m pytest -q -rfE -p no:cacheprovider tests/gpu/test_tiled_attention.py \
    -k "chunked or decode_launch or deterministic_rows or routes or canonical_decode_kernel or tile_table or kv_does" \
    >"$OUT/gpu_tests_e1.txt" 2>&1
log "gpu tests (kernels) exit $? ($(tail -n 1 "$OUT/gpu_tests_e1.txt"))"
timeout 150 python3 -m pytest -q -rfE -p no:cacheprovider tests/gpu/test_engine_cuda.py tests/gpu/test_canonical_stream_cuda.py \
    >"$OUT/gpu_tests_e2.txt" 2>&1
log "gpu tests (engine) exit $? ($(tail -n 1 "$OUT/gpu_tests_e2.txt"))"
log "done"
