#!/usr/bin/env bash
# Round 46, device call S (carry .dev_stage/b, at once after stage_a.sh carried .dev_stage/a): issue 10's
# no-regression targets on today's tree, last measured in rounds 3-8 (steady decode) and issue 4's run (the kernel
# figures): steady decode at batch 256, wall over replayed kernels, with and without the overlap, on the 8B shape and
# the real SmolLM2 (`benchmarks/serving.py --phases steady`); the fast decode replay against the weight + K/V floor
# and the canonical pass per committed token at R = 512 (`benchmarks/gpu_bench.py`, the 8B shape).
#
#   bash benchmarks/device/r46_call_s.sh
source "$(dirname "$0")/session_preamble.sh"
source "$(dirname "$0")/smollm2_env.sh"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv | tee -a "$LOG"
timeout 150 python3 benchmarks/serving.py --device cuda --model 8b --phases steady --budget-s 120 --no-plots \
    --out "$OUT/steady_8b.json" >"$OUT/steady_8b.txt" 2>&1
log "steady 8b exit $?"; grep -E "steady decode" "$OUT/steady_8b.txt"
timeout 150 python3 benchmarks/serving.py --device cuda --model "$SMOL" --cache-dir /tmp/llm42_models --phases steady \
    --budget-s 120 --no-plots --out "$OUT/steady_smollm2.json" >"$OUT/steady_smollm2.txt" 2>&1
log "steady smollm2 exit $?"; grep -E "steady decode" "$OUT/steady_smollm2.txt"
timeout 240 python3 benchmarks/gpu_bench.py --out "$OUT/gpu_bench_8b.json" >"$OUT/gpu_bench_8b.txt" 2>&1
log "gpu_bench exit $?"; tail -n 30 "$OUT/gpu_bench_8b.txt"
log "done"
