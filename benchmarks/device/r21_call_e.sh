#!/usr/bin/env bash
# Round 21, device call E: a row-invariant canonical head on the wanted rows only. GPU tests (its bits equal every
# row's head; the GEMM pins keep round 18's bits; the Triton GEMM's wide passes); long prompts on round 20's
# canonical pass (round 18's GEMM schedules, the head on all R rows; the call named its files
# long_prompts_r20_canonical_*.json) and on this tree's; the 15K profile.
#
#   bash benchmarks/device/r21_call_e.sh
exec bash "$(dirname "$0")/r21_long_prompt_ab.sh" e "schedules or triton"
