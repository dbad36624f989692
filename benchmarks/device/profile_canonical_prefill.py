"""Where a deterministic prompt's canonical prefill spends its device time, by kernel class.

    PYTHONPATH=src python3 benchmarks/device/profile_canonical_prefill.py --out prof.json \
        [--prompt 8192] [--groups 8,64] [--model 8b] [--modes det,free] [--canonical-gemm triton]
        [--canonical-tile-m 128] [--block-size 16]

For each G in ``--groups`` (R = 32 x G canonical rows per pass) one generator prefills one
``--prompt``-token prompt (``max_new_tokens=1``) per mode of ``--modes`` (``det``: deterministic, the canonical
passes; ``free``: the fast path) eagerly (no CUDA graphs, so the profiler sees every kernel) under
``torch.profiler``, after one warm-up prompt. Kernels are summed into classes (GEMM, attention, norm/row ops,
sampler/other) and the top kernels are listed. A diagnostic, not a benchmark: eager launches add host time, not
kernel time.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

from llm42 import DVRGenerator, SamplingParams  # noqa: E402
from llm42.bench.models import build_model  # noqa: E402
from llm42.policies import FastPolicy, FixedShapePolicy  # noqa: E402


def kernel_class(name: str) -> str:
    low = name.lower()
    if "attention" in low:
        return "attention"
    if any(k in low for k in ("gemm", "cutlass", "sm90", "nvjet", "xmma", "cublas", "matmul")):
        return "gemm"
    if any(k in low for k in ("rms", "norm", "rope", "silu", "swiglu", "residual", "fused")):
        return "row_ops"
    return "other"


def prefill_once(gen: DVRGenerator, prompt: list[int], deterministic: bool = True) -> None:
    rid = gen.submit(prompt, SamplingParams(max_new_tokens=1, ignore_eos=True, deterministic=deterministic))
    while not gen.is_finished(rid):
        gen.step()
    gen.result(rid)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="8b")
    p.add_argument("--prompt", type=int, default=8192)
    p.add_argument("--groups", default="8,64")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--modes", default="det")
    p.add_argument("--canonical-gemm", default="cublas")
    p.add_argument("--canonical-tile-m", type=int, default=64)
    p.add_argument("--block-size", type=int, default=16)
    args = p.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = build_model(args.model, device=device, dtype=dtype, max_positions=args.prompt + 128, seed=0)
    rng = random.Random(0)
    results = {"prompt_tokens": args.prompt, "model": args.model, "runs": []}
    for group in (int(g) for g in args.groups.split(",")):
        for mode in args.modes.split(","):
            gen = DVRGenerator(model.weights, model.cfg, window=32, group=group, max_num_seqs=4,
                               max_fast_tokens=2048, kv_cache_tokens=3 * (args.prompt + 128),
                               max_model_len=args.prompt + 128, use_cuda_graphs=False, block_size=args.block_size,
                               canonical_policy=FixedShapePolicy(gemm=args.canonical_gemm,
                                                                 tile_m=args.canonical_tile_m),
                               fast_policy=FastPolicy(canonical_tile_m=args.canonical_tile_m))
            det = mode == "det"
            warm = [rng.randrange(3, model.cfg.vocab_size) for _ in range(min(2048, args.prompt))]
            prefill_once(gen, warm, det)  # warm-up: compiles every kernel of a chunk
            prompt = [rng.randrange(3, model.cfg.vocab_size) for _ in range(args.prompt)]
            torch.cuda.synchronize() if device.type == "cuda" else None
            with profile(activities=[ProfilerActivity.CUDA if device.type == "cuda" else ProfilerActivity.CPU]) as prof:
                prefill_once(gen, prompt, det)
                torch.cuda.synchronize() if device.type == "cuda" else None
            by_class: dict[str, float] = {}
            kernels = []
            for evt in prof.key_averages():
                us = evt.device_time_total if hasattr(evt, "device_time_total") else evt.cuda_time_total
                if us <= 0:
                    continue
                cls = kernel_class(evt.key)
                by_class[cls] = by_class.get(cls, 0.0) + us / 1e3
                kernels.append({"name": evt.key[:120], "class": cls, "ms": us / 1e3, "calls": evt.count})
            kernels.sort(key=lambda k: -k["ms"])
            run = {"group": group, "mode": mode, "rows_per_pass": 32 * group, "passes": gen.stats["canonical_passes"],
                   "kernel_ms_by_class": by_class, "kernel_ms_total": sum(by_class.values()), "top": kernels[:15]}
            results["runs"].append(run)
            print(json.dumps({k: v for k, v in run.items() if k != "top"}, indent=1), flush=True)
            for k in kernels[:8]:
                print(f"  {k['ms']:9.2f} ms {k['calls']:6d}x {k['class']:9s} {k['name']}", flush=True)
            gen.close()
            args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
