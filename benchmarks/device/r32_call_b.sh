#!/usr/bin/env bash
# Round 32, device calls B and C (B carries .dev_stage/b at once after r32_call_a.sh; C, at once after B, nothing
# staged): r31_call_b.sh's A/B of SmolLM2's dvr@50 (real model, 1,000 chat requests, nondet and dvr@50, ABBA in one
# process) with other variants.
# - B: the canonical GEMM at M = 1,024 with round 31's buckets (a narrow pass keeps its bucket, its GEMMs pad their
#   one block; round 27's buckets computed 2.16x the rows used and served at 0.63 against the default's 0.76), and
#   the same with verify-only passes held for 1,024 rows or 8 steps (gemm_rows_1024_batched), beside the default.
# - C (VARIANTS=default,batched,order_budget): passes held for 512 rows (round 25's "many narrow passes" regime) and
#   the longest output budget first (round 30's step model: 469 against 505 steps), beside the default.
#
#   bash benchmarks/device/r32_call_b.sh                                        # call B
#   VARIANTS=default,batched,order_budget bash benchmarks/device/r32_call_b.sh  # call C
VARIANTS=${VARIANTS:-default,gemm_rows_1024,gemm_rows_1024_batched} CAP=${CAP:-540} BUDGET=${BUDGET:-120} \
    exec bash "$(dirname "$0")/r31_call_b.sh"
