#!/usr/bin/env bash
# Round 18, device call C: the wide-pass GPU tests under the Triton canonical GEMM with the TMA tiles pinned (call B's
# run of them was cut by its timeout), a long prompt's prefill attention chunk by chunk (fast configs, the canonical
# launch at 64 / 128 rows), and a second TMA tile sweep on the 8B shape's weights.
#
#   bash benchmarks/device/r18_call_c.sh
source "$(dirname "$0")/session_preamble.sh"
timeout 200 python3 -m pytest -v -p no:cacheprovider tests/gpu/test_wide_pass_cuda.py tests/test_batch_invariant.py \
    -k "triton or tma or pinned_tiles_keep_every" >"$OUT/gpu_tests_c.txt" 2>&1
log "gpu tests exit $? ($(tail -n 1 "$OUT/gpu_tests_c.txt"))"
grep -E "PASSED|FAILED|ERROR" "$OUT/gpu_tests_c.txt" | tail -n 20
timeout 150 python3 benchmarks/device/prefill_chunk_attention.py --out "$OUT/prefill_chunks.json" \
    --lengths 8192,15000 >"$OUT/prefill_chunks.txt" 2>&1
log "prefill chunk sweep exit $?"
cat "$OUT/prefill_chunks.txt" | tail -n 30
timeout 130 python3 benchmarks/device/gemm_config_sweep.py --out "$OUT/gemm_sweep_tma2.json" --models 8b \
    --rows 256,1024,2048 --reps 10 --candidates tma2 >"$OUT/gemm_sweep_tma2.txt" 2>&1
log "gemm sweep 2 exit $?"
cat "$OUT/gemm_sweep_tma2.txt" | tail -n 6
log "done"
