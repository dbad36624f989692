#!/usr/bin/env bash
# Next device call A (carry .dev_stage/a: it stages the SmolLM2 GGUF's first half for the call after it, e.g.
# VARIANTS=default MODES=nondet,dvr@10,dvr@50 ONLINE_VARIANTS=default ONLINE_REPEATS=2 TAG=b ROUND=r50 CAP=420
# BUDGET=90 bash benchmarks/device/r38_call_b.sh with .dev_stage/b). What round 49 left unrun with the decode
# order on by default: the GPU contract tests, whose decode graphs now capture the step's sort (the engine's
# needle test, the pass-order tests), then how much of an 8B decode step's GEMMs and attention can run at once
# (overlap_potential.py: serial against concurrent streams, and the attention on green contexts of 32 / 64 SMs),
# then the decode attention's launch sweep (block / warps / stages x order, K/V TB/s, bits against the default).
#
#   bash benchmarks/device/r50_call_a.sh
export RUN_TESTS=1 TEST_CAP=${TEST_CAP:-180}
export GPU_TESTS="tests/gpu/test_engine_cuda.py tests/gpu/test_pass_order_cuda.py"
source "$(dirname "$0")/stage_a.sh"
timeout "${OVERLAP_CAP:-90}" python3 benchmarks/device/overlap_potential.py --out "$OUT/overlap_potential.json" \
    >"$OUT/overlap_potential.txt" 2>&1
log "overlap potential exit $?"; grep -v Warn "$OUT/overlap_potential.txt" | cut -c1-500 | tail -n 4
timeout "${SWEEP_CAP:-150}" python3 benchmarks/device/decode_attention_sweep.py --out "$OUT/decode_attention_sweep.json" \
    --reps "${REPS:-15}" ${SWEEP_ARGS:---block-n 32,64,128 --warps 4,8 --stages 2,3} >"$OUT/decode_attention_sweep.txt" 2>&1
log "sweep exit $?"; grep '"by_order"' "$OUT/decode_attention_sweep.txt" | cut -c1-400
log "done"
