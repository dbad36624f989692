#!/usr/bin/env bash
# One device call (right after a call that copied .dev_stage/a/part_a to /root; this one carries
# .dev_stage/b): the 8B head calibrated to SmolLM2's flip rate, its Fig. 10 and Fig. 9 (issue 11),
# then the GPU kernel tests.
#
#   bash benchmarks/device/calibration_session.sh [FIGURES_BUDGET_S]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/llm42_out}
mkdir -p "$OUT"
LOG="$OUT/session_log.txt"
BUDGET=${1:-380}
START=$(date +%s)
log() { echo "[+$(( $(date +%s) - START ))s] $*" | tee -a "$LOG"; }
export PYTHONUNBUFFERED=1
if ! ls /root/smollm2/*.gguf >/dev/null 2>&1; then
    bash benchmarks/device/join_smollm2.sh >>"$LOG" 2>&1 || log "join_smollm2.sh failed"
fi
export PYTHONPATH="src:/tmp/site"
SMOL=$(ls /root/smollm2/*.gguf 2>/dev/null | head -n 1)
CACHE=/tmp/llm42_models
if [ -n "$SMOL" ]; then
    python3 -c "import sys; from pathlib import Path; from llm42.bench.serving import prepare_checkpoint; \
prepare_checkpoint(sys.argv[1], Path(sys.argv[2]))" "$SMOL" "$CACHE" >>"$LOG" 2>&1 || log "conversion failed"
    log "figures (budget ${BUDGET}s)"
    timeout $((BUDGET + 20)) python3 benchmarks/paper_figures.py --device cuda --model "$SMOL" --random-model 8b \
        --cache-dir "$CACHE" --real-figures "" --random-figures 10,9 --no-worst-case --budget-s "$BUDGET" \
        --no-plots --out "$OUT/paper_figures_calibrated_8b.json" >>"$LOG" 2>&1
    log "figures exit $?"
else
    log "no SmolLM2 GGUF: figures skipped"
fi
left=$(( 570 - ($(date +%s) - START) ))
if (( left > 30 )); then
    timeout "$left" python3 -m pytest -v -p no:cacheprovider -m gpu --durations=10 tests/gpu/test_kernels.py \
        tests/gpu/test_fused.py >"$OUT/gpu_tests_kernels.txt" 2>&1
    log "kernel tests exit $?"
    tail -n 3 "$OUT/gpu_tests_kernels.txt" >>"$LOG"
fi
log "done"
