#!/usr/bin/env bash
# Round 16, device call B: the graph row ladder (DVRGenerator(graph_bucket_step=)). GPU tests of mixed steps and the
# contract on the new default, then the offline set through profile_steps on the 8B shape (512 seqs) and the
# SmolLM2 shape (256 seqs, random weights), one process each, the ladders side by side: 4096 (powers of two, the
# old ladder), 256, 128 (8B) / 4096, 256 (SmolLM2).
#
#   bash benchmarks/device/r16_call_b.sh
source "$(dirname "$0")/session_preamble.sh"
timeout 190 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_mixed_cuda.py \
    "tests/gpu/test_engine_cuda.py::test_needle_is_bit_identical_alone_and_in_random_batches" \
    >"$OUT/gpu_tests_b.txt" 2>&1
log "gpu tests exit $? ($(tail -n 1 "$OUT/gpu_tests_b.txt"))"
timeout 260 python3 benchmarks/device/profile_steps.py --out "$OUT/ladder_8b.json" --model 8b \
    --max-num-seqs 512 --bucket-steps 4096,256,128 >"$OUT/ladder_8b.txt" 2>&1
log "profile_steps 8b exit $?"
timeout 110 python3 benchmarks/device/profile_steps.py --out "$OUT/ladder_smollm2.json" --model smollm2 \
    --max-num-seqs 256 --bucket-steps 4096,256 >"$OUT/ladder_smollm2.txt" 2>&1
log "profile_steps smollm2 exit $?"
python3 - "$OUT"/ladder_8b.json "$OUT"/ladder_smollm2.json <<'PY' | tee -a "$LOG"
import json, sys
for path in sys.argv[1:]:
    try:
        d = json.load(open(path))
    except Exception as exc:  # noqa: BLE001
        print(path, "unreadable", exc)
        continue
    for key, run in d["runs"].items():
        mixed = run["kinds"].get("mixed", {})
        print(path.rsplit("/", 1)[-1], key, run["output_tok_per_s"], "tok/s", run["steps"], "steps",
              run["ms_per_step"], "ms/step warmup_s", run["warmup_s"], "mixed graphs", run["mixed_graphs_captured"],
              "mixed:", {x: mixed.get(x) for x in ("steps", "mean_wall_ms", "mean_mixed_graph_ms",
                                                    "mean_padded_rows", "rows_run_over_real")})
PY
log "done"
