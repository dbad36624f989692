"""Where a serving step's time goes: host phases, waits on the device, and the top CUDA kernels.

    PYTHONPATH=src python3 benchmarks/device/profile_serving.py --out profile.json [--model smollm2|8b]

Runs the ShareGPT-like offline set (``--num-requests``, nondet) through ``DVRGenerator``
with each engine phase wrapped in a wall-clock accumulator, then profiles ``--profile-steps``
steps of a fresh batch with ``torch.profiler`` (CUDA kernel time by kernel name, CPU time
by op). Writes one JSON. A diagnostic, not a benchmark: the timers cost a little.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

from llm42 import DVRGenerator, SamplingParams  # noqa: E402
from llm42 import generator as generator_module  # noqa: E402
from llm42.engine.fast_step import FastRecord  # noqa: E402
from llm42.bench.workloads import sharegpt_like  # noqa: E402
from llm42.model.config import ModelConfig, RopeConfig, llama31_8b_config  # noqa: E402
from llm42.model.weights import random_weights  # noqa: E402


def smollm2_shape() -> ModelConfig:
    return ModelConfig(family="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
                       num_heads=9, num_kv_heads=3, head_dim=64, max_position_embeddings=4096, rms_norm_eps=1e-5,
                       rope=RopeConfig(theta=100000.0), tie_word_embeddings=True)


class Timers:
    def __init__(self):
        self.total = defaultdict(float)
        self.calls = defaultdict(int)

    def wrap(self, owner, name: str, label: str):
        fn = getattr(owner, name)

        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.total[label] += time.perf_counter() - t
                self.calls[label] += 1

        setattr(owner, name, timed)

    def report(self, wall: float) -> dict:
        return {k: {"s": round(v, 4), "share_of_wall": round(v / wall, 4), "calls": self.calls[k]}
                for k, v in sorted(self.total.items(), key=lambda kv: -kv[1])}


def build(args):
    cfg = smollm2_shape() if args.model == "smollm2" else llama31_8b_config(max_position_embeddings=4096)
    weights = random_weights(cfg, seed=0, dtype=torch.bfloat16, device="cuda")
    return DVRGenerator(weights, cfg, max_num_seqs=256, max_fast_tokens=args.max_fast_tokens)


def requests(n: int, vocab: int, length_scale: float = 1.0):
    work = sharegpt_like(n, vocab_size=vocab, seed=0, length_scale=length_scale)
    prompts = [list(r.prompt) for r in work.requests]
    params = [SamplingParams(max_new_tokens=r.max_new_tokens, temperature=r.temperature, seed=r.seed,
                             ignore_eos=True) for r in work.requests]
    return prompts, params


def run_all(gen, prompts, params) -> float:
    for p, s in zip(prompts, params):
        gen.submit(p, s)
    t = time.perf_counter()
    while gen.has_unfinished():
        gen.step()
    torch.cuda.synchronize()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", choices=("smollm2", "8b"), default="smollm2")
    ap.add_argument("--num-requests", type=int, default=1000)
    ap.add_argument("--max-fast-tokens", type=int, default=2048)
    ap.add_argument("--profile-steps", type=int, default=40)
    args = ap.parse_args()
    result: dict = {"args": vars(args), "device": torch.cuda.get_device_name()}
    gen = build(args)
    prompts, params = requests(args.num_requests, gen.vocab_size)
    t = time.perf_counter()
    run_all(gen, prompts[:300], params[:300])  # warm-up: captures the graphs the set needs
    result["warmup_s"] = time.perf_counter() - t

    timers = Timers()
    for name in ("_admit", "_deliver"):
        timers.wrap(gen, name, name)
    for name in ("launch", "apply_oldest"):
        timers.wrap(gen.passes, name, f"passes.{name}")
    fast = gen.fast_step
    for name in ("launch", "_launch_prefill", "read"):
        timers.wrap(fast, name, f"fast_step.{name}")
    timers.wrap(gen.scheduler, "schedule", "schedule")
    timers.wrap(gen._pool, "views", "pool.views")
    timers.wrap(generator_module, "validate_plan", "validate_plan")
    timers.wrap(gen.decode_state, "flush", "decode_state.flush")
    timers.wrap(gen.decode_state, "stage_batch", "decode_state.stage_batch")
    if fast.decode_graphs is not None:
        timers.wrap(fast.decode_graphs, "run", "decode_graphs.run")
    if fast.fast_prefill.graphs is not None:
        timers.wrap(fast.fast_prefill.graphs, "run", "prefill_graphs.run")
    timers.wrap(fast.fast_prefill._rows, "stage_segments", "prefill.stage_segments")
    timers.wrap(FastRecord, "wait", "record.wait (device)")
    timers.wrap(FastRecord, "copy_out", "record.copy_out")
    steps0 = gen.stats["steps"]
    wall = run_all(gen, prompts, params)
    steps = gen.stats["steps"] - steps0
    out_tokens = sum(p.max_new_tokens for p in params)
    result["offline"] = {"wall_s": wall, "steps": steps, "ms_per_step": 1e3 * wall / steps,
                         "output_tok_per_s": out_tokens / wall, "phases": timers.report(wall)}
    print(json.dumps(result["offline"], indent=1))

    # torch.profiler over steps of a full batch with prefill going on
    for p, s in zip(prompts[:600], params[:600]):
        gen.submit(p, s)
    for _ in range(30):
        gen.step()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        for _ in range(args.profile_steps):
            gen.step()
        torch.cuda.synchronize()
        prof_wall = time.perf_counter() - t
    averages = prof.key_averages()
    cuda_total = sum(e.self_device_time_total for e in averages) / 1e6
    top_cuda = sorted(averages, key=lambda e: -e.self_device_time_total)[:30]
    top_cpu = sorted(averages, key=lambda e: -e.self_cpu_time_total)[:30]
    result["profile"] = {
        "steps": args.profile_steps, "wall_s": prof_wall, "cuda_kernel_s": cuda_total,
        "gpu_busy_fraction": cuda_total / prof_wall,
        "top_cuda": [{"name": e.key[:120], "s": e.self_device_time_total / 1e6, "count": e.count} for e in top_cuda],
        "top_cpu": [{"name": e.key[:120], "s": e.self_cpu_time_total / 1e6, "count": e.count} for e in top_cpu],
    }
    print(json.dumps({k: v for k, v in result["profile"].items() if not k.startswith("top")}, indent=1))
    for e in result["profile"]["top_cuda"][:15]:
        print(f"{e['s'] * 1e3:9.2f} ms {e['count']:6d}  {e['name']}")
    while gen.has_unfinished():
        gen.step()
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
