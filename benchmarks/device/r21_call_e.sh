#!/usr/bin/env bash
# Round 21, device call E: a row-invariant canonical head on the wanted rows only. GPU tests (its bits equal every
# row's head; the GEMM pins keep round 18's bits, negative control fixed; the Triton GEMM's wide passes); long prompts
# (8B, the long-prompt canonical config) on round 20's canonical pass (round 18's GEMM schedules, the head on all R
# rows) and on this tree's, alternated twice; the 15K prompt's kernel profile, deterministic and free.
#
#   bash benchmarks/device/r21_call_e.sh
source "$(dirname "$0")/session_preamble.sh"
timeout 170 python3 -m pytest -v -p no:cacheprovider tests/test_batch_invariant.py tests/gpu/test_wide_pass_cuda.py \
    -k "schedules or triton" >"$OUT/gpu_tests_e.txt" 2>&1
log "gpu tests exit $? ($(tail -n 1 "$OUT/gpu_tests_e.txt"))"
grep -E "PASSED|FAILED|ERROR" "$OUT/gpu_tests_e.txt" | tail -n 12
LP="--device cuda --model 8b --lengths 8192,15000 --reps 2 --canonical-gemm triton --canonical-tile-m 128 --block-size 16 --budget-s 70"
for round in 1 2; do
    timeout 75 python3 benchmarks/device/with_round20_canonical.py -m llm42.bench.long_prompts $LP \
        --out "$OUT/long_prompts_r20_canonical_$round.json" >>"$OUT/long_prompts.txt" 2>&1
    log "long prompts, round 20's canonical pass ($round), exit $?"
    timeout 75 python3 -m llm42.bench.long_prompts $LP --out "$OUT/long_prompts_r21_$round.json" \
        >>"$OUT/long_prompts.txt" 2>&1
    log "long prompts, this tree ($round), exit $?"
done
grep -E "TTFT [0-9]|with_round20|rror" "$OUT/long_prompts.txt" | tail -n 24
timeout 100 python3 benchmarks/device/profile_canonical_prefill.py --out "$OUT/profile_15k_det_free.json" \
    --prompt 15000 --groups 64 --modes det,free --canonical-gemm triton --canonical-tile-m 128 --block-size 16 \
    >"$OUT/profile_15k_det_free.txt" 2>&1
log "profile exit $?"
grep -v "^USDT" "$OUT/profile_15k_det_free.txt" | grep -E "ms|mode" | head -n 30
log "done"
