#!/usr/bin/env bash
# Round 30, device calls B and C (B carries .dev_stage/b right after call A, which copied the GGUF's first half to
# /root; C, at once after B so that /root survives, carries nothing staged): the canonical GEMM at a fixed M served.
# Round 25's arithmetic: SmolLM2's dvr@50 spends 1.1-1.4 s of device time on ~300K canonical rows in wide passes,
# whose GEMMs run as one cuBLAS call per 256 rows (4.2x one large call at these shapes); 0.80 of nondet leaves ~1.0 s.
# FixedShapePolicy(gemm_rows=N) runs them at M = N (round 27; its GPU tests passed in round 29's call A). This runs
# the real SmolLM2, 1,000 chat requests, nondet / dvr@10 / dvr@50 for the default and M = 1,024 / 2,048 (each its
# own canonical config: `dvr_ab.py` compares a variant's deterministic outputs only with its own config's); B in
# that order, C (ORDER=ba) reversed: ABBA over two processes. Limits hold the generator builds (each run captures
# its graphs, ~25 s a run in round 29, whose limits cut every process).
#
#   bash benchmarks/device/r30_call_b.sh            # call B
#   ORDER=ba bash benchmarks/device/r30_call_b.sh   # call C
source "$(dirname "$0")/session_preamble.sh"
source "$(dirname "$0")/smollm2_env.sh"
variants=default,gemm_rows_1024,gemm_rows_2048; tag=b
[ "${ORDER:-ab}" = ba ] && variants=gemm_rows_2048,gemm_rows_1024,default && tag=c
timeout 540 python3 benchmarks/device/dvr_ab.py --model "$SMOL" --cache-dir /tmp/llm42_models \
    --variants "$variants" --modes nondet,dvr@10,dvr@50 --budget-s 120 --warmup-requests 8 --warmup-modes dvr@50 \
    --out "$OUT/gemm_rows_${tag}.json" >"$OUT/gemm_rows_${tag}.txt" 2>&1
log "dvr_ab exit $?"
grep -E "^\[dvr_ab\]|^\{" "$OUT/gemm_rows_${tag}.txt" | grep -v warm-up | tail -n 40
log "done"
