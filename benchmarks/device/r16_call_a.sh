#!/usr/bin/env bash
# Round 16, device call A: torch.compile's max-autotune GEMMs against cuBLAS on the fast path's shapes (issue 10,
# item 1), then where the 8B shape's offline steps go at max_num_seqs 512 (kinds, rows run vs real rows: the
# graphs' bucket padding).
#
#   bash benchmarks/device/r16_call_a.sh
source "$(dirname "$0")/session_preamble.sh"
timeout 260 python3 benchmarks/device/fast_gemm_ab.py --out "$OUT/fast_gemm_ab.json" --models 8b,smollm2 \
    --rows 256,512,2048,64,1024 --budget-s 220 >>"$LOG" 2>&1
log "fast_gemm_ab exit $?"
timeout 200 python3 benchmarks/device/profile_steps.py --out "$OUT/profile_steps_8b.json" --model 8b \
    --max-num-seqs 512 >"$OUT/profile_steps_8b.txt" 2>&1
log "profile_steps 8b exit $?"
python3 - "$OUT/profile_steps_8b.json" <<'PY' | tee -a "$LOG"
import json, sys
d = json.load(open(sys.argv[1]))
for key, run in d["runs"].items():
    print(key, run["output_tok_per_s"], "tok/s", run["steps"], "steps", run["ms_per_step"], "ms/step")
    for kind, k in run["kinds"].items():
        print(" ", kind, {x: k[x] for x in ("steps", "share_of_wall", "mean_wall_ms", "mean_decode_graph_ms",
              "mean_mixed_graph_ms", "mean_prefill_graph_ms", "mean_decode_rows", "mean_prefill_rows",
              "mean_padded_rows", "rows_run_over_real")})
PY
grep -E "cublas" "$LOG" | tail -n 40
log "done"
