#!/usr/bin/env bash
# Round 21, device call G: the GEMM ceiling's spread between fresh processes, timed as measure_ceilings does (3
# warm-ups) and after ~35 ms of products (six processes, both orders).
#
#   bash benchmarks/device/r21_call_g.sh
source "$(dirname "$0")/session_preamble.sh"
for i in 1 2 3; do
    timeout 30 python3 benchmarks/device/ceiling_warmup.py --order short,long --out "$OUT/ceiling_warmup.jsonl"
    timeout 30 python3 benchmarks/device/ceiling_warmup.py --order long,short --out "$OUT/ceiling_warmup.jsonl"
done
log "done"
