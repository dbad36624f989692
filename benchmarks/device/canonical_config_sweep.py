"""Candidate launch configurations of the tiled canonical attention kernel, at a wide pass's shape.

    PYTHONPATH=src python3 benchmarks/device/canonical_config_sweep.py OUT.json [--lengths 8192,15000,32768]

(``--smoke``: tiny shapes, two configurations, for Triton's interpreter on a CPU; the CPU suite runs
the same checks in tests/test_canonical_config_sweep.py.)

The canonical kernel's configuration (tile M-rows, key block, warps, stages) is part of the
canonical config: a faster one changes committed bits, and is only a candidate if a row's bits
stay its own under it. For each context L (8B shape: 32 query heads, 8 kv heads, head dim 128,
bf16, pages of 16, a shuffled block table) the last ``--rows`` rows of one sequence (a wide
pass's slab: positions [L - rows, L)) are launched with each configuration, and the script reports

- ``ms`` and ``tflops`` (causal FLOPs of the slab; CUDA events, median of ``--reps``);
- ``rows_differing_when_regrouped``: rows whose bits change when the same rows are launched in
  two parts split at an odd row (so every tile holds other neighbours): must be 0;
- ``rows_differing_from_current``: rows whose bits differ from the current canonical
  configuration's (what adopting it would change);
- each configuration twice: every key block masked (``CANONICAL_MASK_EVERY_BLOCK``), and with the
  blocks that every row of a tile sees in full unmasked (key ``...-unmasked-full-blocks``): if that
  variant differs from the masked one in no row, it is a speed-up that changes no committed bit;
- ``fast_configs``: each configuration as a fast-path launch (FMA contraction on), timed;
- the fast prefill kernel's time on the same slab, for reference.

A diagnostic for choosing the next canonical configuration, not a test.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

from llm42.bench import devicetime  # noqa: E402
from llm42.kernels import tiled_attention  # noqa: E402

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE = 32, 8, 128, 16
CURRENT = ((tiled_attention.CANONICAL_TILE_M, 64)
           + tiled_attention.CANONICAL_LAUNCH[tiled_attention.CANONICAL_TILE_M])
CANDIDATES = [CURRENT, (64, 64, 4, 3), (64, 64, 8, 2), (64, 128, 4, 2), (64, 128, 8, 2), (128, 64, 8, 2),
              (128, 64, 8, 3), (128, 64, 4, 2), (128, 128, 8, 2), (32, 64, 4, 2)]


def launch(q, k, v, positions, row_seq, table, config, *, mask_every_block=True, canonical=True):
    block_m, block_n, warps, stages = config
    return tiled_attention._launch(q, k, v, positions, row_seq, table, block_size=PAGE, scale=HEAD_DIM ** -0.5,
                                   sliding_window=None, block_m=block_m, block_n=block_n, num_warps=warps,
                                   num_stages=stages, is_canonical=canonical, mask_every_block=mask_every_block)


def differing_rows(a: torch.Tensor, b: torch.Tensor) -> int:
    return int((a.view(a.shape[0], -1).view(torch.int16) != b.view(b.shape[0], -1).view(torch.int16))
               .any(dim=1).sum())


def sweep_length(length: int, rows: int, *, device: torch.device, dtype: torch.dtype, reps: int, heads: tuple,
                 candidates) -> dict:
    num_heads, num_kv_heads, head_dim = heads
    gen = torch.Generator().manual_seed(length)
    num_blocks = -(-length // PAGE)
    k = torch.randn(num_blocks * PAGE + PAGE, num_kv_heads, head_dim, generator=gen).to(device, dtype)
    v = torch.randn(num_blocks * PAGE + PAGE, num_kv_heads, head_dim, generator=gen).to(device, dtype)
    table = torch.randperm(num_blocks + 1, generator=gen)[:num_blocks].view(1, -1).to(device)
    q = torch.randn(rows, num_heads, head_dim, generator=gen).to(device, dtype)
    positions = torch.arange(length - rows, length, device=device)
    row_seq = torch.zeros(rows, dtype=torch.int64, device=device)
    span = rows * (length - rows) + rows * (rows + 1) / 2  # keys seen by the slab's rows
    flops = 4 * span * head_dim * num_heads
    out = {"length": length, "rows": rows, "configs": {}, "fast_configs": {}}
    reference = launch(q, k, v, positions, row_seq, table, CURRENT)
    cut = rows // 3 + 1  # an odd split: every tile of the second part starts at another row
    for config in candidates:
        name = "x".join(map(str, config))
        for mask_every_block in (True, False):
            key = name + ("" if mask_every_block else "-unmasked-full-blocks")
            try:
                run = lambda q_, p_, r_: launch(q_, k, v, p_, r_, table, config,  # noqa: E731
                                                mask_every_block=mask_every_block)
                full = run(q, positions, row_seq)
                parts = torch.cat([run(q[:cut], positions[:cut], row_seq[:cut]),
                                   run(q[cut:], positions[cut:], row_seq[cut:])])
                ms = devicetime.median_ms(lambda: run(q, positions, row_seq), device, reps=reps)
                out["configs"][key] = {"ms": ms, "tflops": flops / (ms * 1e-3) / 1e12,
                                       "rows_differing_when_regrouped": differing_rows(full, parts),
                                       "rows_differing_from_current": differing_rows(full, reference)}
            except Exception as exc:  # noqa: BLE001 - a config the compiler or the chip cannot take: recorded
                out["configs"][key] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        try:  # the same configuration as a fast-path launch (FMA contraction on), for the fast path's choice
            ms = devicetime.median_ms(lambda: launch(q, k, v, positions, row_seq, table, config, canonical=False,
                                                     mask_every_block=False), device, reps=reps)
            out["fast_configs"][name] = {"ms": ms, "tflops": flops / (ms * 1e-3) / 1e12}
        except Exception as exc:  # noqa: BLE001
            out["fast_configs"][name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    fast = lambda: tiled_attention.tiled_prefill_attention(q, k, v, positions, row_seq, table,  # noqa: E731
                                                           block_size=PAGE, scale=head_dim ** -0.5)
    ms = devicetime.median_ms(fast, device, reps=reps)
    out["fast_prefill"] = {"ms": ms, "tflops": flops / (ms * 1e-3) / 1e12}
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("output", type=Path)
    p.add_argument("--lengths", default="8192,15000,32768")
    p.add_argument("--rows", type=int, default=2048)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--configs", default=None, help="candidates to time, e.g. 64x64x4x2,128x64x4x2 (default: all)")
    p.add_argument("--smoke", action="store_true", help="CPU (Triton's interpreter): tiny shapes, two configs")
    args = p.parse_args()
    if args.smoke:
        device, dtype, heads, lengths, rows, reps = torch.device("cpu"), torch.float32, (4, 2, 16), (80,), 40, 1
        candidates = [CURRENT, (32, 32, 4, 2)]
    else:
        if not torch.cuda.is_available():
            raise SystemExit("canonical_config_sweep needs a CUDA device (or --smoke under TRITON_INTERPRET=1)")
        device, dtype, heads = torch.device("cuda"), torch.bfloat16, (NUM_HEADS, NUM_KV_HEADS, HEAD_DIM)
        lengths, rows, reps = tuple(int(x) for x in args.lengths.split(",")), args.rows, args.reps
        candidates = CANDIDATES if args.configs is None else [
            tuple(int(v) for v in c.split("x")) for c in args.configs.split(",")]
    results = {"current": "x".join(map(str, CURRENT)), "key": "block_m x block_n x warps x stages",
               "lengths": []}
    for length in lengths:
        row = sweep_length(length, rows, device=device, dtype=dtype, reps=reps, heads=heads, candidates=candidates)
        results["lengths"].append(row)
        for key, r in row["configs"].items():
            print(f"L={length} {key:14s} " + (f"{r['ms']:8.3f} ms {r['tflops']:6.1f} TFLOP/s regrouped-diff "
                                              f"{r['rows_differing_when_regrouped']} vs-current "
                                              f"{r['rows_differing_from_current']}" if "ms" in r else r["error"]),
                  flush=True)
        for key, r in row["fast_configs"].items():
            print(f"L={length} fast {key:14s} " + (f"{r['ms']:8.3f} ms" if "ms" in r else r["error"]), flush=True)
        print(f"L={length} fast prefill   {row['fast_prefill']['ms']:8.3f} ms", flush=True)
        args.output.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
