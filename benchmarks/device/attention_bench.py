"""Prefill attention on one Llama-3.1-8B-shaped sequence: the row kernel vs the tiled kernels (CUDA).

For each prompt length (default 512, 2048, 8192) one sequence's rows [0, L) attend causally over its
paged cache (32 query heads, 8 kv heads, head dim 128, bf16, pages of 16, a shuffled block table):

- ``rows``: ``canonical_attention``, one program per (row, kv head): what fast prefill chunks and the
  canonical pass ran before the tiled kernels;
- ``tiled_prefill``: ``tiled_prefill_attention`` at its default config, plus a sweep of configs;
- ``tiled_canonical``: ``tiled_canonical_attention`` (the canonical launch configuration), in the varlen
  layout (one block-table row) and in the static layout the canonical pass stages (a table copy per row,
  ``table_rows`` pointing at the first row).

Each is timed with CUDA events (median of ``--reps`` launches after warm-up). The JSON written to the
path given on the command line holds the milliseconds, the speed-ups over ``rows``, the attention
TFLOP/s (causal: 2 * 2 * L^2 / 2 * head_dim * heads) and the largest difference from ``rows``.

    PYTHONPATH=src python benchmarks/device/attention_bench.py benchmarks/results/attention_h200.json
"""

from __future__ import annotations

import argparse
import json

import torch
import triton

from llm42.bench import devicetime
from llm42.kernels import canonical_attention, tiled_canonical_attention, tiled_prefill_attention
from llm42.kernels import tiled_attention

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE = 32, 8, 128, 16
SWEEP = [(64, 64, 4, 2), (64, 64, 4, 3), (128, 64, 8, 2), (128, 64, 8, 3), (128, 64, 4, 2), (128, 128, 8, 2),
         (64, 32, 4, 2)]


def median_ms(fn, *, warmup: int, reps: int) -> float:
    return devicetime.median_ms(fn, torch.device("cuda"), warmup=warmup, reps=reps)


def bench_length(length: int, *, warmup: int, reps: int, sweep: bool) -> dict:
    gen = torch.Generator().manual_seed(length)
    num_blocks = -(-length // PAGE)
    dev, dtype = "cuda", torch.bfloat16
    k = torch.randn(num_blocks * PAGE + PAGE, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(dev, dtype)
    v = torch.randn(num_blocks * PAGE + PAGE, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(dev, dtype)
    table = torch.randperm(num_blocks + 1, generator=gen)[:num_blocks].view(1, -1).to(dev)
    q = torch.randn(length, NUM_HEADS, HEAD_DIM, generator=gen).to(dev, dtype)
    positions = torch.arange(length, device=dev)
    row_seq = torch.zeros(length, dtype=torch.int64, device=dev)
    static_tables = table.expand(length, -1).contiguous()  # the canonical pass's layout: a table copy per row
    scale = HEAD_DIM ** -0.5
    common = dict(block_size=PAGE, scale=scale)

    runs = {
        "rows": lambda: canonical_attention(q, k, v, positions, torch.arange(length, device=dev), static_tables,
                                            **common),
        "tiled_prefill": lambda: tiled_prefill_attention(q, k, v, positions, row_seq, table, **common),
        "tiled_canonical": lambda: tiled_canonical_attention(q, k, v, positions, row_seq, table, **common),
        "tiled_canonical_static": lambda: tiled_canonical_attention(q, k, v, positions, row_seq, static_tables,
                                                                    **common),
    }
    flops = 2 * 2 * (length * (length + 1) / 2) * HEAD_DIM * NUM_HEADS
    out = {"length": length}
    ref = runs["rows"]()
    for name, fn in runs.items():
        out[f"{name}_ms"] = median_ms(fn, warmup=warmup, reps=reps)
        out[f"{name}_tflops"] = flops / (out[f"{name}_ms"] * 1e-3) / 1e12
        out[f"{name}_max_abs_diff_vs_rows"] = float((fn().float() - ref.float()).abs().max())
    for name in ("tiled_prefill", "tiled_canonical", "tiled_canonical_static"):
        out[f"{name}_speedup_vs_rows"] = out["rows_ms"] / out[f"{name}_ms"]
    out["tiled_prefill_default_config"] = list(tiled_attention.prefill_config(length, NUM_HEADS // NUM_KV_HEADS))
    if sweep:
        out["prefill_sweep_ms"] = {}
        for config in SWEEP:
            key = "x".join(map(str, config))
            try:
                out["prefill_sweep_ms"][key] = median_ms(
                    lambda: tiled_prefill_attention(q, k, v, positions, row_seq, table, config=config, **common),
                    warmup=warmup, reps=reps)
            except Exception as exc:  # a config the compiler or the chip cannot take: recorded, not fatal
                out["prefill_sweep_ms"][key] = f"failed: {type(exc).__name__}: {exc}"[:300]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", help="where to write the JSON results")
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 8192])
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--no-sweep", action="store_true", help="skip the fast kernel's config sweep")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("attention_bench needs a CUDA device")
    results = {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
        "shape": {"num_heads": NUM_HEADS, "num_kv_heads": NUM_KV_HEADS, "head_dim": HEAD_DIM, "page": PAGE,
                  "dtype": "bfloat16"},
        "canonical_config": {"tile_m": tiled_attention.CANONICAL_TILE_M, "key_block": 64,
                             "warps": tiled_attention.CANONICAL_LAUNCH[tiled_attention.CANONICAL_TILE_M][0],
                             "stages": tiled_attention.CANONICAL_LAUNCH[tiled_attention.CANONICAL_TILE_M][1]},
        "lengths": [],
    }
    for length in args.lengths:
        row = bench_length(length, warmup=args.warmup, reps=args.reps, sweep=not args.no_sweep)
        results["lengths"].append(row)
        print(f"L={length:6d}  rows {row['rows_ms']:9.3f} ms | tiled prefill {row['tiled_prefill_ms']:8.3f} ms "
              f"({row['tiled_prefill_speedup_vs_rows']:5.1f}x, {row['tiled_prefill_tflops']:5.1f} TFLOP/s) | "
              f"tiled canonical {row['tiled_canonical_ms']:8.3f} ms ({row['tiled_canonical_speedup_vs_rows']:5.1f}x)"
              f" | static {row['tiled_canonical_static_ms']:8.3f} ms "
              f"({row['tiled_canonical_static_speedup_vs_rows']:5.1f}x)", flush=True)
        if "prefill_sweep_ms" in row:
            print("          sweep (block_m x block_n x warps x stages):",
                  {k: (round(v, 3) if isinstance(v, float) else v) for k, v in row["prefill_sweep_ms"].items()})
    with open(args.output, "w") as f:
        json.dump(results, f, indent=2)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
