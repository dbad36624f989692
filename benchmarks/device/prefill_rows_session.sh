#!/usr/bin/env bash
# One device call: does a larger canonical pass cut a deterministic prompt's TTFT? (issue 12)
#
#   bash benchmarks/device/prefill_rows_session.sh      (OUT=... as the device tool sets it)
#
# The kernel-class profile of one 8,192-token deterministic prefill at R = 256 and R = 2,048
# (benchmarks/device/profile_canonical_prefill.py), long_prompts' TTFT at 8,192 and 15,000 tokens
# with G = 8 (R = 256, the default) and G = 64 (R = 2,048) side by side, then the GPU tests
# not yet run on CUDA. Copies .dev_stage/a/part_a to /root when it was carried (the SmolLM2 stage).
source "$(dirname "$0")/session_preamble.sh"
log "profile"
timeout 110 python3 benchmarks/device/profile_canonical_prefill.py --prompt 8192 --groups 8,64 \
    --out "$OUT/profile_canonical_prefill.json" >>"$LOG" 2>&1
log "profile exit $?"
for g in 8 64; do
    timeout 140 python3 -m llm42.bench.long_prompts --device cuda --model 8b --lengths 8192,15000 --reps 1 \
        --group "$g" --budget-s 120 --no-plots --out "$OUT/long_prompts_g$g.json" >>"$LOG" 2>&1
    log "long_prompts G=$g exit $?"
done
timeout 150 python3 -m pytest -v -p no:cacheprovider -m gpu --durations=10 tests/gpu/test_long_context_cuda.py \
    tests/test_close.py tests/gpu/test_tiled_attention.py >"$OUT/gpu_tests.txt" 2>&1
log "tests exit $?"
tail -n 3 "$OUT/gpu_tests.txt" >>"$LOG"
log "done"
