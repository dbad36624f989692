#!/usr/bin/env bash
# One device call: the canonical attention kernel with unmasked full key blocks (issue 12), and the
# canonical pass on its own stream in the long-prompt ITL phase (issue 10).
#
#   bash benchmarks/device/unmasked_session.sh       (OUT=... as the device tool sets it)
#
# 1. benchmarks/device/canonical_config_sweep.py at 8,192 / 15,000 / 32,768 keys: every candidate
#    configuration masked and unmasked, its bits regrouped and against the current configuration's;
# 2. the GPU suite's canonical attention tests for both launches (bit-for-bit equality of the two, row
#    independence, K/V independent of chunking, the canonical pass, the decode launch);
# 3. long_prompts on the 8B shape: the canonical pass with the unmasked launch ("tiled", the default) and
#    with every block masked ("tiled_masked"), then the default with --canonical-stream.
# Copies .dev_stage/a/part_a to /root when it was carried (the SmolLM2 stage for the next call).
source "$(dirname "$0")/session_preamble.sh"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv >>"$LOG" 2>&1
timeout 170 python3 benchmarks/device/canonical_config_sweep.py "$OUT/canonical_config_sweep.json" \
    --lengths 8192,15000,32768 --reps 8 >"$OUT/sweep_log.txt" 2>&1
log "sweep exit $?"
timeout 150 python3 -m pytest -v -p no:cacheprovider -m gpu --durations=8 tests/gpu/test_tiled_attention.py \
    -k "unmasked or row_bits or kv_does_not or canonical_pass_row_bits or decode_launch or tiled_canonical_matches" \
    >"$OUT/gpu_tests_unmasked.txt" 2>&1
log "tests exit $?"
tail -n 6 "$OUT/gpu_tests_unmasked.txt" >>"$LOG"
timeout 110 python3 -m llm42.bench.long_prompts --device cuda --model 8b --lengths 8192,15000,32768 --reps 2 \
    --budget-s 95 --no-plots --out "$OUT/long_prompts_unmasked.json" >>"$LOG" 2>&1
log "long_prompts tiled (unmasked full blocks) exit $?"
timeout 60 python3 -m llm42.bench.long_prompts --device cuda --model 8b --lengths 8192,15000 --reps 1 \
    --budget-s 50 --no-plots --canonical-attention tiled_masked --out "$OUT/long_prompts_masked.json" >>"$LOG" 2>&1
log "long_prompts tiled_masked exit $?"
timeout 60 python3 -m llm42.bench.long_prompts --device cuda --model 8b --lengths 8192 --reps 1 \
    --budget-s 50 --no-plots --canonical-stream --out "$OUT/long_prompts_stream_on.json" >>"$LOG" 2>&1
log "long_prompts --canonical-stream exit $?"
log "done"
