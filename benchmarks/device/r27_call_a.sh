#!/usr/bin/env bash
# Round 27, device call A (carries .dev_stage/a): the GPU tests of the canonical GEMM at a fixed M (new: cuBLAS at
# M = 512 / 1,024 / 2,048 gives a row its bits alone, in blocks and shuffled; narrow and wide passes commit the same
# bits with FixedShapePolicy(gemm_rows=N)), round 26's canonical-stream test at every priority, the green-context and
# batch-invariant tests; then one canonical pass of 32-2,048 rows timed per variant (SmolLM2 shape, CUDA graphs,
# CUDA events, medians of 15): the default (cuBLAS on 256-row blocks) against every GEMM at M = 512 / 1,024 / 2,048
# and the Triton GEMM; rows256 (M = R written into one output: the default's bits if mm(out=) gives F.linear's).
#
#   bash benchmarks/device/r27_call_a.sh
source "$(dirname "$0")/session_preamble.sh"
export LLM42_GPU_REPORT="$OUT/gpu_report_a.jsonl"
# the gemm_rows tests on the 8B shape 8 layers deep (its equalities hold layer by layer; 4x sooner), the others as
# every round ran them (their negative controls need the full depth's drift)
LLM42_GPU_TEST_LAYERS=8 timeout 150 python3 -m pytest -q -m gpu tests/gpu/test_gemm_rows_cuda.py -p no:cacheprovider \
    >"$OUT/gpu_tests_a_gemm_rows.txt" 2>&1
log "gpu tests (gemm_rows) exit $?"; tail -n 6 "$OUT/gpu_tests_a_gemm_rows.txt"
timeout 220 python3 -m pytest -q -m gpu tests/gpu/test_canonical_stream_cuda.py tests/gpu/test_canonical_sms_cuda.py \
    tests/test_batch_invariant.py -p no:cacheprovider >"$OUT/gpu_tests_a.txt" 2>&1
log "gpu tests exit $?"; tail -n 6 "$OUT/gpu_tests_a.txt"
timeout 160 python3 benchmarks/device/pass_ab.py --model smollm2 --variants serial_tiles,rows256,rows512,rows1024,rows2048,triton \
    --contexts 600,2400 --reps 15 --out "$OUT/pass_ab_smollm2_r27_a.json" >"$OUT/pass_ab.txt" 2>&1
log "pass_ab exit $?"; tail -n 14 "$OUT/pass_ab.txt"
log "done"
