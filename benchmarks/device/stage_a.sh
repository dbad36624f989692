#!/usr/bin/env bash
# A device call that only stages (carry .dev_stage/a): session_preamble.sh copies the first half of the SmolLM2
# GGUF to /root, where a call right after it (carrying .dev_stage/b) joins it; what the GPU is, for the log.
#
#   bash benchmarks/device/stage_a.sh
source "$(dirname "$0")/session_preamble.sh"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv | tee -a "$LOG"
log "staged"
