#!/usr/bin/env bash
# Round 41, device call A2 (carry .dev_stage/a; stages the GGUF's first half for r41_call_b.sh right after it): a
# canonical pass's host time by function on this GPU host (profile_passes.py --host-profile, SmolLM2's shape, random
# weights, verify passes of 1-16 windows and prompt chunks of 256 / 512 rows).
#
#   bash benchmarks/device/r41_call_a2.sh
source "$(dirname "$0")/session_preamble.sh"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv | tee -a "$LOG"
python3 -c "import sys; sys.path.insert(0, 'src'); from llm42.bench.hostprobe import host_probe; print('host probe', host_probe())" | tee -a "$LOG"
timeout "${CAP:-120}" python3 benchmarks/device/profile_passes.py --model smollm2 --out "$OUT/passes_host_r41.json" \
    --max-canonical-tokens 512 --reps 20 --host-profile >"$OUT/passes_host_r41.txt" 2>&1
log "profile_passes exit $?"; tail -n 30 "$OUT/passes_host_r41.txt"
log "done"
