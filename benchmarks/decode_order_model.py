"""A model (not a measurement) of the split decode kernel's program order: how long after an even spread of the work
a launch ends when its programs are dispatched in order onto ``--slots`` program slots (two per SM of 132: the
default launch's shared memory) and each takes time in proportion to its keys. ShareGPT-like running batches (a
prompt and a uniform share of an output from the serving workload's log-normals), 8 kv heads, one split (the
batches here fill four waves). Orders: sequence-major (the default grid until round 49), head-major, head-major
longest first (the default since).

    python3 benchmarks/decode_order_model.py --out benchmarks/results/cpu_round48/decode_order_model.json

It ignores that a program alone on an SM reads faster than one sharing it, so it bounds what the order can give;
``benchmarks/device/decode_attention_sweep.py --orders`` measures it.
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "device"))

from decode_attention_sweep import sharegpt_contexts  # noqa: E402

KV_HEADS = 8


def makespan(jobs: list[int], slots: int) -> float:
    """When the last of ``jobs`` (durations, dispatched in order, each to the first free slot) ends."""
    free = [0.0] * slots
    for job in jobs:
        heapq.heappush(free, heapq.heappop(free) + job)
    return max(free)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--slots", type=int, default=264)
    ap.add_argument("--batches", default="320,512,1024")
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    rows = []
    for num_seqs in map(int, args.batches.split(",")):
        for seed in range(args.seeds):
            ctx = sharegpt_contexts(num_seqs, seed).tolist()
            even = sum(ctx) * KV_HEADS / args.slots
            orders = {"seq": [c for _ in range(KV_HEADS) for c in ctx],
                      "head": [c for c in ctx for _ in range(KV_HEADS)],
                      "head_longest": [c for c in sorted(ctx, reverse=True) for _ in range(KV_HEADS)]}
            rows.append({"num_seqs": num_seqs, "seed": seed, "mean_context": round(sum(ctx) / num_seqs, 1),
                         "max_context": max(ctx), **{f"{k}_over_even": round(makespan(v, args.slots) / even, 3)
                                                     for k, v in orders.items()}})
            print(json.dumps(rows[-1]))
    Path(args.out).write_text(json.dumps({"slots": args.slots, "kv_heads": KV_HEADS, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
