#!/usr/bin/env bash
# Round 21, device call D: the canonical Triton GEMM's new schedules. GPU tests (the pins keep round 18's bits; TMA
# rows their own; wide passes with the Triton GEMM commit the R-row passes' bits); long prompts on round 18's
# schedules (the call ran them through with_r18_gemm_pins.py, now with_round20_canonical.py --only pins; its output
# files were named long_prompts_r18_pins_*.json) and on this tree's; the 15K profile.
#
#   bash benchmarks/device/r21_call_d.sh
exec bash "$(dirname "$0")/r21_long_prompt_ab.sh" d \
    "schedules or tma_tiles_keep_every or pinned_tiles_keep_every or triton" --only pins
