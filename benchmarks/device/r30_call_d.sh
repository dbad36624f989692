#!/usr/bin/env bash
# Round 30, device call D, if the session has ~550 s left after calls A-C (carries .dev_stage/base, and
# .dev_stage/b too unless it runs right after C, so that the GGUF is joined again): round 28's host cuts on the
# H200. The real SmolLM2, 1,000 chat requests offline, nondet / dvr@10 / dvr@50, the tree before them (9bceb0b,
# staged into .dev_stage/base: `git archive 9bceb0b src benchmarks/device/dvr_ab.py
# benchmarks/device/batched_passes.py | tar -x -C .dev_stage/base`) against this tree's default and gc_freeze,
# each tree in its own process (ORDER=ba: this tree first), then the two trees' deterministic digests compared
# (round 28 moved host work only: the same bits). Round 29 ran this with limits sized for serving alone and every
# process was cut; each run builds its generator (every graph captured, ~25 s a run there), so the limits are 200 s
# for base's three runs and 330 s for this tree's six.
#
#   bash benchmarks/device/r30_call_d.sh
#   ORDER=ba bash benchmarks/device/r30_call_d.sh
source "$(dirname "$0")/session_preamble.sh"
source "$(dirname "$0")/smollm2_env.sh"
[ -d .dev_stage/base/src/llm42 ] || { log "no .dev_stage/base/src: stage it (see the header)"; exit 1; }
order="base this"; tag=d
[ "${ORDER:-ab}" = ba ] && order="this base" && tag=d2
for tree in $order; do
    root=.; variants=default,gc_freeze; budget=120; limit=330
    [ "$tree" = base ] && root=.dev_stage/base && variants=default && budget=60 && limit=200
    PYTHONPATH="$root/src:/tmp/site" timeout "$limit" python3 "$root/benchmarks/device/dvr_ab.py" --model "$SMOL" \
        --cache-dir /tmp/llm42_models --variants "$variants" --modes nondet,dvr@10,dvr@50 --budget-s "$budget" \
        --warmup-requests 8 --warmup-modes dvr@50 --out "$OUT/host_ab_${tag}_${tree}.json" \
        >"$OUT/host_ab_${tag}_${tree}.txt" 2>&1
    log "$tree exit $?"
    grep -E "^\[dvr_ab\]" "$OUT/host_ab_${tag}_${tree}.txt" | grep -v warm-up | tail -n 24
done
python3 benchmarks/device/dvr_ab.py --compare "$OUT/host_ab_${tag}_base.json" "$OUT/host_ab_${tag}_this.json" \
    --out "$OUT/host_ab_${tag}_digests.json" | tail -n 5
log "done"
