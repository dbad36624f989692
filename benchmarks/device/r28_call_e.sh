#!/usr/bin/env bash
# Round 28, device call E (after a call that left the joined SmolLM2 GGUF on the warm machine, e.g. r27 call B or
# C; it carries .dev_stage/base): the host A/B of round 28. Round 28 moved a canonical pass's staging and applying
# into NumPy and cut the per-step bookkeeping (one-pass scheduling, written-out views and reads): 0.44-0.70x a
# pass's host ms, 0.79x / 0.71x a step's at 1,000 requests (none / half deterministic) on the CPU
# (benchmarks/cpu_host_ab.py). Whether the H200's served runs gain is what this measures: dvr_ab.py (default
# engine, nondet and dvr@50) on the tree before round 28 (its src/ and dvr_ab.py, staged into .dev_stage/base: each
# tree runs its own script and package) and on this tree (with the gc_freeze variant beside its default), four
# processes in ABBA order; then the deterministic digests of the two trees compared (the same bits: the change is
# host work). At most ~570 s.
#
#   git archive 9bceb0b src benchmarks/device/dvr_ab.py benchmarks/device/batched_passes.py \
#       | tar -x -C .dev_stage/base        # once, here (.dev_stage is ignored); then carry [".dev_stage/base"]
#   bash benchmarks/device/r28_call_e.sh
source "$(dirname "$0")/session_preamble.sh"
source "$(dirname "$0")/smollm2_env.sh"
[ -d .dev_stage/base/src/llm42 ] || { log "no .dev_stage/base/src: stage it (see the header)"; exit 1; }
i=0
for tree in base this this base; do
    i=$((i + 1))
    # each tree its own script and package; this tree also runs gc_freeze (the timed run frozen out of the cyclic
    # collector's passes, what `llm42 serve` does): the same bits, so the contract check compares it with default
    root=.; variants=default,gc_freeze; budget=130; limit=170
    [ "$tree" = base ] && root=.dev_stage/base && variants=default && budget=70 && limit=110
    PYTHONPATH="$root/src:/tmp/site" timeout "$limit" python3 "$root/benchmarks/device/dvr_ab.py" --model "$SMOL" \
        --cache-dir /tmp/llm42_models --variants "$variants" --modes nondet,dvr@50 --budget-s "$budget" \
        --warmup-requests 8 --warmup-modes dvr@50 --out "$OUT/host_ab_${i}_${tree}.json" \
        >"$OUT/host_ab_${i}_${tree}.txt" 2>&1
    log "host A/B run $i ($tree) exit $?"
    grep -E "^\[dvr_ab\]" "$OUT/host_ab_${i}_${tree}.txt" | grep -v warm-up | tail -n 8
done
python3 benchmarks/device/dvr_ab.py --compare "$OUT/host_ab_1_base.json" "$OUT/host_ab_2_this.json" \
    --out "$OUT/host_ab_digests.json" | tail -n 5
log "done"
