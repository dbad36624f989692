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
