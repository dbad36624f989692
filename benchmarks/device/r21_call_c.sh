#!/usr/bin/env bash
# Round 21, device call C: (1) the canonical Triton GEMM's second schedule sweep (narrow and wide tiles, flattened,
# on qkv / o / down / the output head; round 18's pins beside this tree's, bits compared); (2) why call B's 8B
# nondet ran at 7.9K tok/s against round 18's 9.8K: the 8B calibrated nondet / dvr@10 run on round 19's tiled
# attention and on this tree's, side by side on one machine.
#
#   bash benchmarks/device/r21_call_c.sh   (needs benchmarks/device/baseline_r19/tiled_attention_r19.py, untracked:
#   git show 56037d0:src/llm42/kernels/tiled_attention.py > benchmarks/device/baseline_r19/tiled_attention_r19.py)
source "$(dirname "$0")/session_preamble.sh"
timeout 200 python3 benchmarks/device/gemm_schedule.py --out "$OUT/gemm_schedule_2.json" --rows 2048 --reps 20 \
    --timeout-s 60 --shapes qkv,o,down,lm_head --groups round18,pinned,tiles_narrow,tiles_wide \
    >"$OUT/gemm_schedule_2.txt" 2>&1
log "gemm_schedule exit $?"
grep -E "^\[gemm|sum over|OTHER" "$OUT/gemm_schedule_2.txt" | tail -n 20
AB="--model 8b --variants default --modes nondet,dvr@10 --lm-head-std 0.2 --lm-head-bias-scale 26.9 --max-num-seqs 1024 --budget-s 110"
timeout 170 python3 benchmarks/device/with_r19_attention.py benchmarks/device/dvr_ab.py $AB \
    --out "$OUT/dvr_ab_8b_r19_kernel.json" >"$OUT/dvr_ab_8b.txt" 2>&1
log "dvr_ab 8b, round 19's kernel, exit $?"
timeout 170 python3 benchmarks/device/dvr_ab.py $AB --out "$OUT/dvr_ab_8b_this_tree.json" >>"$OUT/dvr_ab_8b.txt" 2>&1
log "dvr_ab 8b, this tree, exit $?"
grep -E "^\[dvr_ab\]|with_r19|rror" "$OUT/dvr_ab_8b.txt" | grep -v warm-up | tail -n 12
log "done"
