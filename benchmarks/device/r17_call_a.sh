#!/usr/bin/env bash
# Round 17, device call A (issue 10, the 8B shape's offline throughput): where a fast step's device time goes by
# kernel class (mixed phase, middle, decode tail) at 512 sequences, then the offline set through profile_steps at
# 512 / 768 sequences (2,048 fast tokens) and at 512 sequences with 4,096 fast tokens (one process each).
#
#   bash benchmarks/device/r17_call_a.sh
source "$(dirname "$0")/session_preamble.sh"
timeout 170 python3 benchmarks/device/profile_step_kernels.py --out "$OUT/step_kernels_8b.json" --model 8b \
    --max-num-seqs 512 --windows 40:50,250:260,900:910 >"$OUT/step_kernels_8b.txt" 2>&1
log "profile_step_kernels exit $?"
timeout 200 python3 benchmarks/device/profile_steps.py --out "$OUT/seqs_8b.json" --model 8b \
    --max-num-seqs 512,768 >"$OUT/seqs_8b.txt" 2>&1
log "profile_steps seqs exit $?"
timeout 110 python3 benchmarks/device/profile_steps.py --out "$OUT/tokens4096_8b.json" --model 8b \
    --max-num-seqs 512 --max-fast-tokens 4096 >"$OUT/tokens4096_8b.txt" 2>&1
log "profile_steps 4096 exit $?"
python3 - "$OUT"/step_kernels_8b.json "$OUT"/seqs_8b.json "$OUT"/tokens4096_8b.json <<'PY' | tee -a "$LOG"
import json, sys
for path in sys.argv[1:]:
    try:
        d = json.load(open(path))
    except Exception as exc:  # noqa: BLE001
        print(path, "unreadable", exc)
        continue
    name = path.rsplit("/", 1)[-1]
    if "runs" not in d:
        print(name, "graph kernels visible:", d.get("graph_kernels_visible"))
        for key in ("graphs", "eager"):
            for w, r in d.get(key, {}).items():
                print(name, key, w, {k: r[k] for k in ("steps", "mean_decode_rows", "mean_prompt_rows", "mean_rows_run",
                      "wall_ms_per_step", "kernel_ms_per_step", "gemm_tflops")}, r["by_class_ms_per_step"])
        continue
    for key, run in d["runs"].items():
        print(name, key, run["output_tok_per_s"], "tok/s", run["steps"], "steps", run["ms_per_step"], "ms/step")
        for kind, k in run["kinds"].items():
            print("  ", kind, {x: k.get(x) for x in ("steps", "share_of_wall", "mean_wall_ms", "mean_decode_graph_ms",
                  "mean_mixed_graph_ms", "mean_decode_rows", "mean_prefill_rows", "rows_run_over_real")})
PY
log "done"
