#!/usr/bin/env bash
# Next device call (carry .dev_stage/a; stage_a.sh carrying .dev_stage/m and r51_call_e.sh carrying .dev_stage/b
# may follow at once): round 52's cuBLAS-by-M table again, on every decode bucket from 128 to 1,024 rows, for the 8B
# shape and SmolLM2, in two processes, to tell whether the buckets where a larger one is cheaper (round 52, one
# sample: 288, 336, 352, 448 on an H100) repeat. Stages the first third of the SmolLM2 GGUF.
#
#   bash benchmarks/device/r53_call_a.sh
source "$(dirname "$0")/stage_a.sh"
ROWS=$(seq -s, 128 16 1024)
for run in 1 2; do
    timeout "${GEMM_CAP:-220}" python3 benchmarks/device/fast_gemm_ab.py --cublas-only --models 8b,smollm2 \
        --rows "$ROWS" --reps 20 --budget-s 200 --out "$OUT/gemm_rows_$run.json" >"$OUT/gemm_rows_$run.txt" 2>&1
    log "gemm rows run $run exit $?"; grep -cE "TF/s" "$OUT/gemm_rows_$run.txt"
done
log "done"
