# Sourced by the device-call scripts here (bash benchmarks/device/<name>.sh): run from the repository root,
# results and session_log.txt under $OUT (the device tool sets it), log() with seconds since the start,
# the tree's sources on PYTHONPATH, and .dev_stage/a/part_a or .dev_stage/m/part_m (the first or middle third of the
# SmolLM2 stage, when the call carried it) copied to /root for the calls after it.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${OUT:-/tmp/llm42_out}
mkdir -p "$OUT"
LOG="$OUT/session_log.txt"
export PYTHONUNBUFFERED=1 PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
START=$(date +%s)
log() { echo "[+$(( $(date +%s) - START ))s] $*" | tee -a "$LOG"; }
for part in a m; do
    [ -f ".dev_stage/$part/part_$part" ] && cp ".dev_stage/$part/part_$part" "/root/smollm2.part_$part" \
        && log "part_$part copied to /root"
done
# The seconds left of ONE_CAP (560 unless set), for stages that run under what a call has left.
left() { echo $(( ${ONE_CAP:-560} - ($(date +%s) - START) )); }
# run_gpu_tests FILE...: the GPU's name and clocks into the log, then the GPU tests of FILE... under TEST_CAP seconds
# (240 unless set) into $OUT/gpu_tests.txt, with the per-test report and the failure log under $OUT.
run_gpu_tests() {
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv | tee -a "$LOG"
    LLM42_GPU_REPORT="$OUT/gpu_report.jsonl" LLM42_FAIL_LOG="$OUT/failures.txt" timeout "${TEST_CAP:-240}" \
        python3 -m pytest -v -m gpu "$@" -p no:cacheprovider -rfE --durations=8 >"$OUT/gpu_tests.txt" 2>&1
    log "gpu tests exit $?"; grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu_tests.txt" | tail -n 12
}
