#!/usr/bin/env bash
# Round 47, device call A (carry .dev_stage/a: it stages the SmolLM2 GGUF's first half for the call after it): where
# the 8B shape's device time goes on today's tree, in the configuration of issue 10's best 8B nondet figure (round 45:
# 1,024 sequences, admission by budget, 11.0K tok/s on an H100). The ShareGPT-like 1,000-request set, nondet, random
# weights, every graph captured by a first run; windows of steps of the second run under torch.profiler, by kernel
# class (round 17's profile was an H200's, arrival admission, 512 sequences, a tree 30 rounds older).
#
#   bash benchmarks/device/r47_call_a.sh
source "$(dirname "$0")/stage_a.sh"
timeout "${CAP:-420}" python3 benchmarks/device/profile_step_kernels.py --out "$OUT/step_kernels_8b_budget.json" \
    --model 8b --max-num-seqs 1024 --admission budget --windows "${WINDOWS:-30:40,200:210,500:510,800:810,1000:1010}" \
    >"$OUT/step_kernels_8b_budget.txt" 2>&1
log "profile exit $?"; grep -v Warn "$OUT/step_kernels_8b_budget.txt" | cut -c1-600 | tail -n 12
log "done"
