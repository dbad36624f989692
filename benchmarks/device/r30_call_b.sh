#!/usr/bin/env bash
# Round 30, device calls B and C (B carries .dev_stage/b and .dev_stage/base right after call A, which copied the
# GGUF's first half to /root; C carries .dev_stage/base right after B): the real SmolLM2, 1,000 chat requests
# offline, nondet / dvr@10 / dvr@50, the tree before round 28's host cuts (9bceb0b, staged into .dev_stage/base:
# `git archive 9bceb0b src benchmarks/device/dvr_ab.py benchmarks/device/batched_passes.py | tar -x -C
# .dev_stage/base`) against this tree's default and gc_freeze. B runs base then this, C (ORDER=ba) this then base:
# ABBA over the two calls. Round 29's limits were sized for serving alone and cut every process; each run builds
# its generator (every graph captured) inside the process, ~25 s a run there, so the limits are now 200 s for base's
# three runs and 330 s for this tree's six, and the calls' figures are compared by `dvr_ab.py --compare`.
#
#   bash benchmarks/device/r30_call_b.sh            # call B
#   ORDER=ba bash benchmarks/device/r30_call_b.sh   # call C
source "$(dirname "$0")/session_preamble.sh"
source "$(dirname "$0")/smollm2_env.sh"
[ -d .dev_stage/base/src/llm42 ] || { log "no .dev_stage/base/src: stage it (see the header)"; exit 1; }
order="base this"; tag=b
[ "${ORDER:-ab}" = ba ] && order="this base" && tag=c
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
