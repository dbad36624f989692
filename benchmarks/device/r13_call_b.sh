#!/usr/bin/env bash
# Round 13, device call B, right after r13_call_a.sh (carry .dev_stage/b): real SmolLM2, 1,000 chat requests
# offline at max_num_seqs 1,024, nondet / dvr@10 / dvr@50: the default canonical GEMM (cuBLAS on R-row blocks)
# against FixedShapePolicy(gemm="triton"), in two processes with the variants in opposite orders; then the two
# processes' deterministic outputs compared request by request (digests; the same canonical config in two
# processes must commit the same tokens).
#
#   bash benchmarks/device/r13_call_b.sh [BUDGET_S_PER_PROCESS]
source "$(dirname "$0")/session_preamble.sh"
BUDGET=${1:-200}
source "$(dirname "$0")/smollm2_env.sh"
i=0
for variants in split_rows,triton_gemm triton_gemm,split_rows; do
    i=$((i + 1))
    timeout $((BUDGET + 100)) python3 benchmarks/device/dvr_ab.py --model "$SMOL" --cache-dir /tmp/llm42_models \
        --variants "$variants" --budget-s "$BUDGET" --warmup-requests 16 \
        --out "$OUT/dvr_ab_smollm2_r13_p$i.json" >>"$LOG" 2>&1
    log "dvr_ab process $i ($variants) exit $?"
done
python3 benchmarks/device/dvr_ab.py --compare "$OUT/dvr_ab_smollm2_r13_p1.json" "$OUT/dvr_ab_smollm2_r13_p2.json" \
    --out "$OUT/dvr_ab_smollm2_r13_two_processes.json" 2>&1 | tee -a "$LOG"
grep "^\[dvr_ab\]" "$LOG" | grep -v warm-up | tail -n 40
log "done"
