#!/usr/bin/env bash
# Round 46, device call S: issue 10's no-regression targets on today's tree, last measured in rounds 3-8 (steady
# decode) and issue 4's run (the kernel figures): steady decode at batch 256, wall over replayed kernels, with and
# without the overlap, on the 8B shape and the real SmolLM2 (`benchmarks/serving.py --phases steady`); the fast
# decode replay against the weight + K/V floor and the canonical pass per committed token at R = 512
# (`benchmarks/gpu_bench.py`, the 8B shape).
# PART picks what runs: "8b" (the 8B shape's steady decode and gpu_bench; needs no staged model, so it can share the
# staging call: `bash benchmarks/device/stage_a.sh; PART=8b bash benchmarks/device/r46_call_s.sh`, carry
# .dev_stage/a), "smollm2" (SmolLM2's steady decode; carry .dev_stage/b, at once after the staging call), or "all"
# (both, the default; carry .dev_stage/b at once after stage_a.sh).
#
#   [PART=8b|smollm2|all] bash benchmarks/device/r46_call_s.sh
source "$(dirname "$0")/session_preamble.sh"
PART=${PART:-all}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv | tee -a "$LOG"
if [ "$PART" = all ] || [ "$PART" = 8b ]; then
    timeout 150 python3 benchmarks/serving.py --device cuda --model 8b --phases steady --budget-s 120 --no-plots \
        --out "$OUT/steady_8b.json" >"$OUT/steady_8b.txt" 2>&1
    log "steady 8b exit $?"; grep -E "steady decode" "$OUT/steady_8b.txt"
    timeout 240 python3 benchmarks/gpu_bench.py --out "$OUT/gpu_bench_8b.json" >"$OUT/gpu_bench_8b.txt" 2>&1
    log "gpu_bench exit $?"; tail -n 30 "$OUT/gpu_bench_8b.txt"
fi
if [ "$PART" = all ] || [ "$PART" = smollm2 ]; then
    source "$(dirname "$0")/smollm2_env.sh"
    timeout 150 python3 benchmarks/serving.py --device cuda --model "$SMOL" --cache-dir /tmp/llm42_models \
        --phases steady --budget-s 120 --no-plots --out "$OUT/steady_smollm2.json" >"$OUT/steady_smollm2.txt" 2>&1
    log "steady smollm2 exit $?"; grep -E "steady decode" "$OUT/steady_smollm2.txt"
fi
log "done"
