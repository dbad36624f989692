#!/usr/bin/env bash
# Round 14, device call A (carry .dev_stage/a): copies part_a to /root for call B. What deterministic decode rows
# cost in a fast step (SmolLM2's shape, 256 decode rows at 2,400 positions, graph replay, CUDA events): the
# split kernel for every row; FastPolicy(decode_kernel="deterministic") on the tiled canonical kernel's bits (one
# program per row and kv head walks the whole context); the same on the chunked kernel's bits (each row's 512-key
# chunks in parallel); 10 % and 50 % of the rows deterministic. The same runs time canonical passes on the tiled
# and on the chunked canonical attention at that context. Then the kernels of an 8B-shape canonical pass at 6,144
# positions by class (eager, torch.profiler): where a long deterministic prompt's canonical prefill goes.
#
#   bash benchmarks/device/r14_call_a.sh
source "$(dirname "$0")/session_preamble.sh"
PP="python3 benchmarks/device/profile_passes.py --model smollm2 --context 2400"
timeout 120 $PP --decode-only --det-fractions 0,0.5 --out "$OUT/decode_split_smollm2_c2400.json" >>"$LOG" 2>&1
log "split rows exit $?"
timeout 150 $PP --fast-decode-kernel deterministic --det-fractions 0.1,0.5 \
    --out "$OUT/passes_tiled_det_smollm2_c2400.json" >>"$LOG" 2>&1
log "tiled + deterministic rows exit $?"
timeout 150 $PP --fast-decode-kernel deterministic --canonical-attention chunked --det-fractions 0.1,0.5 \
    --out "$OUT/passes_chunked_det_smollm2_c2400.json" >>"$LOG" 2>&1
log "chunked + deterministic rows exit $?"
grep -E "^(verify|chunk|decode|kind|NVIDIA)" "$LOG" | tail -n 40
timeout 150 python3 benchmarks/device/profile_passes.py --model 8b --context 6144 --seqs 64 --kernel-profile \
    --out "$OUT/passes_kernels_8b_c6144.json" 2>&1 | grep -v "^USDT\|^STAGE" | tee -a "$LOG" | tail -n 4
log "8B kernel profile exit $?"
log "done"
