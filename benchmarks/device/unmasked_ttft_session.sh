#!/usr/bin/env bash
# One device call: the canonical tiled attention tests through the canonical pass and the policies, then
# long_prompts on the 8B shape at 8,192 / 15,000 / 32,768 tokens, medians of 3, with the canonical launch
# that skips the masks on full key blocks ("tiled", the default) and the one that masks every block
# ("tiled_masked", the same bits) one after the other (issue 12).
#
#   bash benchmarks/device/unmasked_ttft_session.sh       (OUT=... as the device tool sets it)
source "$(dirname "$0")/session_preamble.sh"
timeout 120 python3 -m pytest -v -p no:cacheprovider -m gpu --durations=8 tests/gpu/test_tiled_attention.py \
    -k "canonical_pass_row_bits or fast_policy or decode_launch" >"$OUT/gpu_tests_canonical_pass.txt" 2>&1
log "tests exit $?"
tail -n 3 "$OUT/gpu_tests_canonical_pass.txt" >>"$LOG"
for kernel in tiled tiled_masked; do
    timeout 130 python3 -m llm42.bench.long_prompts --device cuda --model 8b --lengths 8192,15000,32768 --reps 3 \
        --budget-s 115 --no-plots --canonical-attention "$kernel" --out "$OUT/long_prompts_$kernel.json" >>"$LOG" 2>&1
    log "long_prompts $kernel exit $?"
done
log "done"
