#!/usr/bin/env bash
# One device call (issue 10): offline steps with mixed fast steps (power-of-two decode buckets) and the fast
# prefill attention kernel's tile configuration as a parameter, side by side in one process per model
# (benchmarks/device/profile_steps.py --prefill-configs): SmolLM2 shape at max_num_seqs 256 and 1,024,
# the 8B shape (500 requests) at 256.
#
#   bash benchmarks/device/prefill_tiles_session.sh       (OUT=... as the device tool sets it)
source "$(dirname "$0")/session_preamble.sh"
timeout 75 python3 benchmarks/device/profile_steps.py --out "$OUT/profile_steps_tiles_smollm2_256.json" \
    --model smollm2 --max-num-seqs 256 --mixed-steps on --prefill-configs current,32x64x2x2,16x64x2x2 >>"$LOG" 2>&1
log "smollm2 256 exit $?"
timeout 45 python3 benchmarks/device/profile_steps.py --out "$OUT/profile_steps_tiles_smollm2_1024.json" \
    --model smollm2 --max-num-seqs 1024 --mixed-steps on --prefill-configs current,32x64x2x2 >>"$LOG" 2>&1
log "smollm2 1024 exit $?"
timeout 95 python3 benchmarks/device/profile_steps.py --out "$OUT/profile_steps_tiles_8b.json" \
    --model 8b --num-requests 500 --max-num-seqs 256 --mixed-steps on --prefill-configs current,32x64x2x2 >>"$LOG" 2>&1
log "8b exit $?"
log "done"
