#!/usr/bin/env bash
# Round 29, device call B (carries .dev_stage/b and .dev_stage/base, right after call A; the GGUF is joined here):
# the real SmolLM2, 1,000 chat requests offline, nondet / dvr@10 / dvr@50. ABA over two trees: the tree before
# round 28's host cuts (9bceb0b's src/ and dvr_ab.py, staged into .dev_stage/base: `git archive 9bceb0b src
# benchmarks/device/dvr_ab.py benchmarks/device/batched_passes.py | tar -x -C .dev_stage/base`) against this tree
# with round 26-28's variants beside its default: gc_freeze (what `llm42 serve` does), the canonical GEMM at
# M = 1,024 (other committed bits, its own config), canonical_priority="high". Then the deterministic
# digests of the two trees' defaults compared (the same bits: round 28 moved host work only).
#
#   bash benchmarks/device/r29_call_b.sh
source "$(dirname "$0")/session_preamble.sh"
source "$(dirname "$0")/smollm2_env.sh"
[ -d .dev_stage/base/src/llm42 ] || { log "no .dev_stage/base/src: stage it (see the header)"; exit 1; }
i=0
for tree in base this base; do
    i=$((i + 1))
    root=.; variants=default,gc_freeze,gemm_rows_1024,canon_priority; budget=150; limit=210
    [ "$tree" = base ] && root=.dev_stage/base && variants=default && budget=40 && limit=95
    PYTHONPATH="$root/src:/tmp/site" timeout "$limit" python3 "$root/benchmarks/device/dvr_ab.py" --model "$SMOL" \
        --cache-dir /tmp/llm42_models --variants "$variants" --modes nondet,dvr@10,dvr@50 --budget-s "$budget" \
        --warmup-requests 8 --warmup-modes dvr@50 --out "$OUT/host_ab_${i}_${tree}.json" \
        >"$OUT/host_ab_${i}_${tree}.txt" 2>&1
    log "run $i ($tree) exit $?"
    grep -E "^\[dvr_ab\]" "$OUT/host_ab_${i}_${tree}.txt" | grep -v warm-up | tail -n 32
done
python3 benchmarks/device/dvr_ab.py --compare "$OUT/host_ab_1_base.json" "$OUT/host_ab_2_this.json" \
    --out "$OUT/host_ab_digests.json" | tail -n 5
log "done"
