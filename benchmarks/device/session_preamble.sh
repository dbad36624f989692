# Sourced by the device-call scripts here (bash benchmarks/device/<name>.sh): run from the repository root,
# results and session_log.txt under $OUT (the device tool sets it), log() with seconds since the start,
# the tree's sources on PYTHONPATH, and .dev_stage/a/part_a (the first half of the SmolLM2 stage, when the
# call carried it) copied to /root for the next call.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${OUT:-/tmp/llm42_out}
mkdir -p "$OUT"
LOG="$OUT/session_log.txt"
export PYTHONUNBUFFERED=1 PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
START=$(date +%s)
log() { echo "[+$(( $(date +%s) - START ))s] $*" | tee -a "$LOG"; }
[ -f .dev_stage/a/part_a ] && cp .dev_stage/a/part_a /root/smollm2.part_a && log "part_a copied to /root"
