#!/usr/bin/env bash
# Round 21, device call D: the canonical Triton GEMM's new schedules. GPU tests (the pins keep round 18's bits, with
# a negative control; TMA rows their own; wide passes with the Triton GEMM commit the R-row passes' bits); long
# prompts (8B, the long-prompt canonical config) on round 18's schedules and on this tree's, alternated twice; the
# 15K prompt's kernel profile, deterministic and free.
#
#   bash benchmarks/device/r21_call_d.sh
source "$(dirname "$0")/session_preamble.sh"
timeout 150 python3 -m pytest -v -p no:cacheprovider tests/test_batch_invariant.py tests/gpu/test_wide_pass_cuda.py \
    -k "schedules or tma_tiles_keep_every or pinned_tiles_keep_every or triton" >"$OUT/gpu_tests_d.txt" 2>&1
log "gpu tests exit $? ($(tail -n 1 "$OUT/gpu_tests_d.txt"))"
grep -E "PASSED|FAILED|ERROR" "$OUT/gpu_tests_d.txt" | tail -n 12
LP="--device cuda --model 8b --lengths 8192,15000 --reps 2 --canonical-gemm triton --canonical-tile-m 128 --block-size 16 --budget-s 70"
for round in 1 2; do
    timeout 75 python3 benchmarks/device/with_r18_gemm_pins.py -m llm42.bench.long_prompts $LP \
        --out "$OUT/long_prompts_r18_pins_$round.json" >>"$OUT/long_prompts.txt" 2>&1
    log "long prompts, round 18's schedules ($round), exit $?"
    timeout 75 python3 -m llm42.bench.long_prompts $LP --out "$OUT/long_prompts_r21_$round.json" \
        >>"$OUT/long_prompts.txt" 2>&1
    log "long prompts, this tree ($round), exit $?"
done
grep -E "TTFT|det / free|rror|with_r18" "$OUT/long_prompts.txt" | tail -n 24
timeout 100 python3 benchmarks/device/profile_canonical_prefill.py --out "$OUT/profile_15k_det_free.json" \
    --prompt 15000 --groups 64 --modes det,free --canonical-gemm triton --canonical-tile-m 128 --block-size 16 \
    >"$OUT/profile_15k_det_free.txt" 2>&1
log "profile exit $?"
grep -v "^USDT" "$OUT/profile_15k_det_free.txt" | grep -E "ms|mode" | head -n 30
log "done"
