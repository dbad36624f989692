#!/usr/bin/env bash
# Round 30, device calls B and C (B carries .dev_stage/b right after call A, which copied the GGUF's first half to
# /root; C, at once after B so that /root survives, carries nothing staged): the levers built for SmolLM2's dvr@50
# (0.67-0.75 of nondet in rounds 23-25; the target is 0.80), served side by side with the default.
# - The canonical GEMM at a fixed M (round 27; its GPU tests passed in round 29's call A): round 25's arithmetic put
#   1.1-1.4 s of device time on ~300K canonical rows in wide passes, whose GEMMs run as one cuBLAS call per 256 rows
#   (4.2x one large call at these shapes); FixedShapePolicy(gemm_rows=N) runs them at M = N (1,024 and 2,048 here,
#   each its own canonical config: `dvr_ab.py` compares a variant's deterministic outputs with its own config's).
# - DefaultScheduler(order="budget") (round 26, never served on a GPU): the longest output budget first wherever rows
#   are short; round 30's step model (benchmarks/cpu_prompt_drafts.py) put it at 469 steps against 505 with passes
#   done 4 steps after launch (300 against 294 at 2). Same canonical config as the default: identical outputs.
# (prompt_drafts, round 30, is not in it: the step model gained nothing from it in the default order.)
# The real SmolLM2, 1,000 chat requests, nondet / dvr@10 / dvr@50; B in this order, C (ORDER=ba) reversed: ABBA over
# two processes. The JSON is rewritten after every run, so a run cut by the limit keeps what finished.
#
#   bash benchmarks/device/r30_call_b.sh            # call B
#   ORDER=ba bash benchmarks/device/r30_call_b.sh   # call C
source "$(dirname "$0")/session_preamble.sh"
source "$(dirname "$0")/smollm2_env.sh"
variants=default,gemm_rows_1024,gemm_rows_2048,order_budget; tag=b
[ "${ORDER:-ab}" = ba ] && variants=order_budget,gemm_rows_2048,gemm_rows_1024,default && tag=c
timeout 570 python3 benchmarks/device/dvr_ab.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --variants "$variants" --modes nondet,dvr@10,dvr@50 --budget-s 144 --warmup-requests 8 --warmup-modes dvr@50 \
    --out "$OUT/gemm_rows_${tag}.json" >"$OUT/gemm_rows_${tag}.txt" 2>&1
log "dvr_ab exit $?"
grep -E "^\[dvr_ab\]|^\{" "$OUT/gemm_rows_${tag}.txt" | grep -v warm-up | tail -n 40
log "done"
