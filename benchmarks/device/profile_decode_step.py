"""What one engine step's kernels are, by kernel name (torch.profiler on CUDA, graph replays included).

    PYTHONPATH=src python3 benchmarks/device/profile_decode_step.py OUT.json [--model smollm2|8b]
        [--batches 16,96,256] [--steps 20]

For each batch size B, B requests with ShareGPT-like prompt lengths (200-1,000 tokens, random weights of
the model's shape) are admitted and prefilled; then ``--steps`` pure decode steps run under torch.profiler.
The JSON gives, per B, every kernel's device time per step and launches per step, the summed kernel time
per step, and the wall time per step. A diagnostic of the decode graph (issue 10), not a benchmark.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from llm42 import DVRGenerator, SamplingParams  # noqa: E402
from llm42.model.config import llama31_8b_config  # noqa: E402
from llm42.model.weights import random_weights  # noqa: E402
from profile_serving import smollm2_shape  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--model", choices=("smollm2", "8b"), default="smollm2")
    ap.add_argument("--batches", default="16,96,256")
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    from torch.profiler import ProfilerActivity, profile

    cfg = smollm2_shape() if args.model == "smollm2" else llama31_8b_config(max_position_embeddings=4096)
    weights = random_weights(cfg, seed=0, dtype=torch.bfloat16, device="cuda")
    result = {"args": vars(args), "device": torch.cuda.get_device_name(), "batches": {}}
    rng = random.Random(0)
    for batch in (int(b) for b in args.batches.split(",")):
        gen = DVRGenerator(weights, cfg, max_num_seqs=max(batch, 16), max_fast_tokens=2048)
        steps = args.steps + 8
        for i in range(batch):
            prompt = [rng.randrange(cfg.vocab_size) for _ in range(rng.randint(200, 1000))]
            gen.submit(prompt, SamplingParams(max_new_tokens=3 * steps, temperature=0.8 if i % 2 else 0.0,
                                              seed=i, ignore_eos=True))
        # every prompt prefilled: no request waiting, none with prompt rows left (round 7's first version
        # counted committed tokens, so its batch-96 and -256 profiles caught steps with prompt rows)
        while gen.num_waiting or any(r.is_prefill for r in gen._pool.running.values()):
            gen.step()
        for _ in range(4):  # decode graphs captured, the pipeline full
            gen.step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            t = time.perf_counter()
            for _ in range(args.steps):
                gen.step()
            torch.cuda.synchronize()
            wall = time.perf_counter() - t
        kernels = [e for e in prof.key_averages() if e.self_device_time_total > 0]
        total = sum(e.self_device_time_total for e in kernels) / 1e3 / args.steps
        rows = sorted(({"name": e.key[:140], "ms_per_step": round(e.self_device_time_total / 1e3 / args.steps, 4),
                        "launches_per_step": round(e.count / args.steps, 2)} for e in kernels),
                      key=lambda r: -r["ms_per_step"])
        result["batches"][str(batch)] = {"wall_ms_per_step": round(1e3 * wall / args.steps, 4),
                                         "kernel_ms_per_step": round(total, 4),
                                         "launches_per_step": round(sum(e.count for e in kernels) / args.steps, 1),
                                         "kernels": rows[:40]}
        print(json.dumps({"batch": batch, **{k: v for k, v in result["batches"][str(batch)].items()
                                            if k != "kernels"}}), flush=True)
        for r in rows[:12]:
            print(f"   {r['ms_per_step']:8.4f} ms x{r['launches_per_step']:6.1f}  {r['name']}", flush=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
        while gen.has_unfinished():
            gen.step()
        gen.close()
        del gen
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
