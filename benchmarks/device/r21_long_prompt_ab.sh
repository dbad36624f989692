#!/usr/bin/env bash
# Round 21, device calls D and E: GPU tests (a -k selection of tests/test_batch_invariant.py and
# tests/gpu/test_wide_pass_cuda.py); long prompts (8B, the long-prompt canonical config) with round 21's canonical
# speed-ups undone (with_round20_canonical.py UNDO...) and on this tree, alternated twice; the 15K prompt's kernel
# profile, deterministic and free.
#
#   bash benchmarks/device/r21_long_prompt_ab.sh CALL "TESTS" [UNDO...]   (r21_call_d.sh, r21_call_e.sh)
source "$(dirname "$0")/session_preamble.sh"
CALL=$1 TESTS=$2
shift 2
timeout 170 python3 -m pytest -v -p no:cacheprovider tests/test_batch_invariant.py tests/gpu/test_wide_pass_cuda.py \
    -k "$TESTS" >"$OUT/gpu_tests_$CALL.txt" 2>&1
log "gpu tests exit $? ($(tail -n 1 "$OUT/gpu_tests_$CALL.txt"))"
grep -E "PASSED|FAILED|ERROR" "$OUT/gpu_tests_$CALL.txt" | tail -n 12
LP="--device cuda --model 8b --lengths 8192,15000 --reps 2 --canonical-gemm triton --canonical-tile-m 128 --block-size 16 --budget-s 70"
for round in 1 2; do
    timeout 75 python3 benchmarks/device/with_round20_canonical.py "$@" -m llm42.bench.long_prompts $LP \
        --out "$OUT/long_prompts_undone_$round.json" >>"$OUT/long_prompts.txt" 2>&1
    log "long prompts, undone: ${*:-pins and head} ($round), exit $?"
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
