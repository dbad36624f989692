#!/usr/bin/env bash
# Round 18, device call D: the long-prompt canonical config FixedShapePolicy(gemm="triton", tile_m=128) with the
# second sweep's TMA tiles pinned (qkv, down): long prompts of 8,192 / 15,000 / 32,768 tokens; then what it costs in
# serving, where deterministic requests' verify passes are narrow (the 8B shape, head calibrated to SmolLM2's flip
# rate, 1,000 requests, default vs triton_tile128, nondet and dvr@10).
#
#   bash benchmarks/device/r18_call_d.sh
source "$(dirname "$0")/session_preamble.sh"
timeout 60 python3 -m pytest -v -p no:cacheprovider tests/test_batch_invariant.py tests/gpu/test_wide_pass_cuda.py \
    -k "pinned_tiles_keep_every or test_the_triton_canonical_gemm" >"$OUT/gpu_tests_d.txt" 2>&1
log "gpu tests (the new pins) exit $? ($(tail -n 1 "$OUT/gpu_tests_d.txt"))"
timeout 150 python3 -m llm42.bench.long_prompts --device cuda --model 8b --lengths 8192,15000,32768 --reps 2 \
    --budget-s 125 --canonical-gemm triton --canonical-tile-m 128 --out "$OUT/long_prompts_triton_tile128_d.json" \
    >"$OUT/long_prompts_triton_tile128_d.txt" 2>&1
log "long_prompts exit $?"
tail -n 9 "$OUT/long_prompts_triton_tile128_d.txt"
timeout 330 python3 benchmarks/device/dvr_ab.py --model 8b --variants default,triton_tile128 \
    --modes nondet,dvr@10 --lm-head-std 0.2 --lm-head-bias-scale 26.9 --max-num-seqs 1024 \
    --budget-s 240 --out "$OUT/dvr_ab_8b_triton_tile128.json" >>"$LOG" 2>&1
log "dvr_ab 8b exit $?"
grep "^\[dvr_ab\]\|num_checked" "$LOG" | tail -n 12
log "done"
