"""The cyclic garbage collector's pauses in engine steps, with and without ``frozen_gc`` (round 28).

    PYTHONPATH=src python3 benchmarks/cpu_gc_pauses.py [--out benchmarks/results/cpu_gc_pauses.json] [--steps 200]

An engine step allocates (views, plans, token lists); Python's collector runs when its thresholds trip, in whichever
step that is, and a full (generation 2) pass visits every tracked object of the process: torch, the model, the
engine, every running request. This serves 1,000 requests (8-token prompts, 300 outputs, half deterministic) over a
one-layer model of width 32 on this CPU and times every collection in ``--steps`` steps (``gc.callbacks``), once as
a plain process and once inside ``llm42.gc_freeze.frozen_gc`` entered after the generator is built, before the
requests arrive (what ``llm42 serve`` does at start-up and ``Engine(gc_freeze=True)`` after a benchmark's
warm-up). Each variant runs in its own process, ``--rounds`` times in turn; the committed tokens must be the same.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def measure(freeze: bool, steps: int) -> dict:
    import gc
    import random

    import torch

    from llm42 import DVRGenerator, SamplingParams
    from llm42.gc_freeze import frozen_gc
    from llm42.model.config import ModelConfig, RopeConfig
    from llm42.model.weights import random_weights

    torch.set_num_threads(1)
    cfg = ModelConfig(family="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                      num_kv_heads=1, head_dim=16, max_position_embeddings=1024, rms_norm_eps=1e-5,
                      rope=RopeConfig(theta=10000.0), eos_token_ids=(2,), bos_token_id=1)
    gen = DVRGenerator(random_weights(cfg, seed=0), cfg, window=32, group=8, max_num_seqs=1024, max_fast_tokens=2048,
                       max_canonical_tokens=2048, wide_verify=True, kv_cache_tokens=1024 * 330, prefix_cache=False)
    pauses: list[tuple[int, float]] = []
    started = [0.0]

    def timing(phase, info):
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pauses.append((info["generation"], (time.perf_counter() - started[0]) * 1e3))

    with frozen_gc(freeze):
        rng = random.Random(0)
        rids = [gen.submit([rng.randrange(3, 64) for _ in range(8)],
                           SamplingParams(max_new_tokens=300, deterministic=rng.random() < 0.5, ignore_eos=True,
                                          temperature=0.8 if i % 2 else 0.0, seed=i)) for i in range(1000)]
        gc.callbacks.append(timing)
        step_ms = []
        for _ in range(steps):
            t = time.perf_counter()
            gen.step()
            step_ms.append((time.perf_counter() - t) * 1e3)
        gc.callbacks.remove(timing)
        tracked = len(gc.get_objects())
    digest = hashlib.sha256(repr([gen.committed_tokens(rid) for rid in rids]).encode()).hexdigest()
    gen.close()
    full = [ms for generation, ms in pauses if generation == 2]
    return {"collections": len(pauses), "full_collections_ms": [round(ms, 2) for ms in full],
            "young_collections_ms_total": round(sum(ms for generation, ms in pauses if generation < 2), 2),
            "tracked_objects_at_end": tracked, "step_ms_median": round(statistics.median(step_ms), 3),
            "step_ms_max": round(max(step_ms), 3), "digest": digest}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/cpu_gc_pauses.json"))
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--child", choices=("plain", "frozen"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.child == "frozen", args.steps)))
        return
    runs: dict[str, list[dict]] = {"plain": [], "frozen": []}
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    for r in range(args.rounds):
        for label in (("plain", "frozen") if r % 2 == 0 else ("frozen", "plain")):
            done = subprocess.run([sys.executable, __file__, "--child", label, "--steps", str(args.steps)], env=env,
                                  capture_output=True, text=True, check=True)
            runs[label].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(label, runs[label][-1], flush=True)
    digests = {run["digest"] for label in runs for run in runs[label]}
    result = {"command": f"python3 benchmarks/cpu_gc_pauses.py --steps {args.steps} --rounds {args.rounds}",
              "steps": args.steps, "runs": runs, "same_tokens": len(digests) == 1}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print("same tokens:", len(digests) == 1)


if __name__ == "__main__":
    main()
