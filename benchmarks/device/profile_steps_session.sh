#!/usr/bin/env bash
# One device call: where an offline serving run's steps go (benchmarks/device/profile_steps.py), 1,000
# ShareGPT-like requests, nondet, random weights: the SmolLM2 shape at max_num_seqs 256 / 512 / 1,024, then
# the 8B shape at 256 / 512 (issue 10).
#
#   bash benchmarks/device/profile_steps_session.sh       (OUT=... as the device tool sets it)
source "$(dirname "$0")/session_preamble.sh"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv >>"$LOG" 2>&1
timeout ${SMOL_S:-200} python3 benchmarks/device/profile_steps.py --out "$OUT/profile_steps_smollm2.json" \
    --model smollm2 --max-num-seqs ${SMOL_SEQS:-256,512,1024} >>"$LOG" 2>&1
log "smollm2 exit $?"
timeout ${BIG_S:-330} python3 benchmarks/device/profile_steps.py --out "$OUT/profile_steps_8b.json" \
    --model 8b --max-num-seqs ${BIG_SEQS:-256,512} >>"$LOG" 2>&1
log "8b exit $?"
log "done"
