#!/usr/bin/env bash
# Round 21, device call F: what round 20's canonical attention launch (4 warps / 3 stages at 64-row tiles, one pass
# per tile-table tile, page ids ahead) does to verify passes, never measured: pass_ab.py's passes (verify windows,
# ragged windows, a prompt chunk) on round 19's kernel and on this tree's, SmolLM2's and the 8B shape; then this
# tree's long prompts (8B, the long-prompt canonical config) at 8K / 15K / 32K, median of 3.
#
#   bash benchmarks/device/r21_call_f.sh   (needs benchmarks/device/baseline_r19/tiled_attention_r19.py, untracked:
#   git show 56037d0:src/llm42/kernels/tiled_attention.py > benchmarks/device/baseline_r19/tiled_attention_r19.py)
source "$(dirname "$0")/session_preamble.sh"
for model in smollm2 8b; do
    if [ "$model" = smollm2 ]; then ARGS="--contexts 600,2400 --variants serial_tiles,tile128 --reps 12 --warmup 2"
    else ARGS="--contexts 600,6144 --variants serial_tiles,tile128_triton --reps 8 --warmup 2"; fi
    timeout 60 python3 benchmarks/device/with_r19_attention.py benchmarks/device/pass_ab.py --model $model $ARGS \
        --out "$OUT/pass_ab_${model}_r19_kernel.json" >"$OUT/pass_ab_${model}.txt" 2>&1
    log "pass_ab $model, round 19's kernel, exit $?"
    timeout 60 python3 benchmarks/device/pass_ab.py --model $model $ARGS --out "$OUT/pass_ab_${model}_r21.json" \
        >>"$OUT/pass_ab_${model}.txt" 2>&1
    log "pass_ab $model, this tree, exit $?"
    grep -vE "^\s*$|Warning|warn" "$OUT/pass_ab_${model}.txt" | tail -n 24
done
timeout 110 python3 -m llm42.bench.long_prompts --device cuda --model 8b --lengths 8192,15000,32768 --reps 3 \
    --canonical-gemm triton --canonical-tile-m 128 --block-size 16 --budget-s 100 --out "$OUT/long_prompts_f.json" \
    >"$OUT/long_prompts_f.txt" 2>&1
log "long prompts exit $?"
grep -E "TTFT [0-9]|det / free|rror" "$OUT/long_prompts_f.txt" | tail -n 8
log "done"
