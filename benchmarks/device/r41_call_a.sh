#!/usr/bin/env bash
# Round 41, device call A (carry .dev_stage/a; stages the GGUF's first half for a call right after it): which of a
# SmolLM2-shaped decode step's kernels a canonical pass beside it slows (beside_kernels.py: verify passes of 1 and 8
# windows, a 512-row prompt chunk; decode steps of 64 and 128 rows).
#
#   bash benchmarks/device/r41_call_a.sh
source "$(dirname "$0")/session_preamble.sh"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv | tee -a "$LOG"
for b in 64 128; do
    timeout "${CAP:-150}" python3 benchmarks/device/beside_kernels.py --out "$OUT/beside_kernels_b$b.json" \
        --batch "$b" --windows 1,8 --chunk 512 >"$OUT/beside_kernels_b$b.txt" 2>&1
    log "beside_kernels batch $b exit $?"; cat "$OUT/beside_kernels_b$b.txt" | tail -n 40
done
log "done"
