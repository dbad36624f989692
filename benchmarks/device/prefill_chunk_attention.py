"""A long prompt's prefill attention as the engine runs it: 2,048-row chunks, fast configs and the canonical launch.

    PYTHONPATH=src python3 benchmarks/device/prefill_chunk_attention.py --out chunks.json [--lengths 8192,15000]
        [--chunk 2048] [--reps 10] [--layouts 16:gather,64:gather,64:tma,128:tma] [--configs all|short|default]

One Llama-3.1-8B-shaped sequence (32 query heads, 8 kv heads, head dim 128, bf16, a shuffled block table) of L
positions, for each K/V layout of ``--layouts`` (page size : how K/V are read, key by key gathers or TMA boxes, the
kernels' ``kv_tma``), prefilled in chunks of ``--chunk`` rows as ``max_fast_tokens`` cuts it: chunk c is rows
[c C, min((c + 1) C, L)) over keys [0, row]. For every fast prefill configuration in ``FAST_CONFIGS`` (block_m,
block_n, warps, stages; the engine's ``prefill_config`` first) and the canonical launch at each tile height, the
device milliseconds of every chunk's launch (CUDA events, median of ``--reps`` after 3 warm-ups), their sum (one
layer's attention for the whole prompt) and the causal attention TFLOP/s. A sweep that picks the fast path's
configuration; the canonical launch's figures say what a deterministic prompt's attention costs beside it. Per
layout with TMA, ``canonical_bits_equal_gather``: whether every chunk's canonical output (each tile height) has
the gathers' bits.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

from llm42.bench.devicetime import median_ms  # noqa: E402
from llm42.engine.config import CANONICAL_TILE_HEIGHTS  # noqa: E402
from llm42.kernels import tiled_canonical_attention, tiled_prefill_attention  # noqa: E402
from llm42.kernels.tiled_attention import prefill_config  # noqa: E402

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 32, 8, 128
FAST_CONFIGS = [(128, 64, 4, 3), (128, 64, 4, 4), (128, 128, 8, 2), (128, 128, 8, 3), (128, 64, 8, 2),
                (128, 64, 8, 3), (64, 64, 4, 3), (128, 32, 4, 2), (128, 128, 4, 2), (64, 128, 4, 2),
                (256, 64, 8, 2), (256, 128, 8, 2)]
# round 18's fastest and what round 19's page-id prefetch may favour (8 warps, deeper pipelines, 64-row tiles)
SHORT_CONFIGS = [(128, 64, 4, 3), (128, 128, 8, 3), (128, 64, 8, 3), (64, 64, 4, 3), (256, 64, 8, 3),
                 (128, 64, 8, 4)]


def chunk_flops(lo: int, hi: int) -> float:
    keys = sum(p + 1 for p in range(lo, hi))
    return 4.0 * keys * HEAD_DIM * NUM_HEADS


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--lengths", default="8192,15000")
    ap.add_argument("--chunk", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--layouts", default="16:gather", help="page:gather|tma, comma-separated")
    ap.add_argument("--configs", choices=["all", "short", "default"], default="all")
    args = ap.parse_args()
    layouts = [(int(page), how == "tma") for page, how in (x.split(":") for x in args.layouts.split(","))]
    configs = {"all": FAST_CONFIGS, "short": SHORT_CONFIGS, "default": []}[args.configs]
    dev, dtype = torch.device("cuda"), torch.bfloat16
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "chunk": args.chunk, "reps": args.reps, "layouts": args.layouts, "lengths": []}
    for length in (int(x) for x in args.lengths.split(",")):
        chunks = [(lo, min(lo + args.chunk, length)) for lo in range(0, length, args.chunk)]
        total_flops = sum(chunk_flops(lo, hi) for lo, hi in chunks)
        entry = {"length": length, "chunks": chunks, "attention_TFLOP": round(total_flops / 1e12, 4), "runs": {},
                 "canonical_bits_equal_gather": {}}
        for page, tma in layouts:
            gen = torch.Generator().manual_seed(length)
            num_blocks = -(-length // page)
            k = torch.randn(num_blocks * page + page, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(dev, dtype)
            v = torch.randn(num_blocks * page + page, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(dev, dtype)
            table = torch.randperm(num_blocks + 1, generator=gen)[:num_blocks].view(1, -1).to(dev)
            q_all = torch.randn(length, NUM_HEADS, HEAD_DIM, generator=gen).to(dev, dtype)
            common = dict(block_size=page, scale=HEAD_DIM ** -0.5, kv_tma=tma)
            staged = [(q_all[lo:hi].contiguous(), torch.arange(lo, hi, device=dev),
                       torch.zeros(hi - lo, dtype=torch.int64, device=dev)) for lo, hi in chunks]
            layout = f"p{page}_{'tma' if tma else 'gather'}"
            runs = {}
            default = prefill_config(args.chunk, NUM_HEADS // NUM_KV_HEADS)
            for config in [default] + [c for c in configs if c != default]:
                if tma and page % config[1]:
                    continue
                runs[f"{layout}_fast_" + "x".join(map(str, config)) + ("_default" if config == default else "")] = (
                    lambda q, p, s, config=config: tiled_prefill_attention(q, k, v, p, s, table, config=config,
                                                                           **common))
            for tile_m in CANONICAL_TILE_HEIGHTS:
                runs[f"{layout}_canonical_tile{tile_m}"] = (
                    lambda q, p, s, tile_m=tile_m: tiled_canonical_attention(q, k, v, p, s, table, tile_m=tile_m,
                                                                             **common))
                if tma:  # the same rows gathered key by key: the bits must not change
                    gathered = dict(common, kv_tma=False)
                    entry["canonical_bits_equal_gather"][f"{layout}_tile{tile_m}"] = all(
                        torch.equal(tiled_canonical_attention(q, k, v, p, s, table, tile_m=tile_m, **common)
                                    .view(torch.int16),
                                    tiled_canonical_attention(q, k, v, p, s, table, tile_m=tile_m, **gathered)
                                    .view(torch.int16))
                        for q, p, s in staged)
            for name, fn in runs.items():
                try:
                    per_chunk = [median_ms(lambda: fn(*s), dev, warmup=3, reps=args.reps)  # noqa: B023
                                 for s in staged]
                except Exception as exc:  # a config the compiler cannot build (shared memory): recorded, skipped
                    entry["runs"][name] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
                    print(f"L={length:6d} {name:36s} {entry['runs'][name]['error']}", flush=True)
                    continue
                total = sum(per_chunk)
                entry["runs"][name] = {"chunk_ms": [round(x, 4) for x in per_chunk], "total_ms": round(total, 4),
                                       "TFLOPs": round(total_flops / (total * 1e-3) / 1e12, 1)}
                print(f"L={length:6d} {name:36s} total {total:8.3f} ms  "
                      f"{total_flops / (total * 1e-3) / 1e12:6.1f} TFLOP/s", flush=True)
            del k, v, q_all, staged
        ok = {n: r for n, r in entry["runs"].items() if "error" not in r and "_fast_" in n}
        entry["best_fast"] = min(ok, key=lambda n: ok[n]["total_ms"]) if ok else None
        print(f"L={length:6d} canonical bits with TMA = gathers: {entry['canonical_bits_equal_gather']}", flush=True)
        result["lengths"].append(entry)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
