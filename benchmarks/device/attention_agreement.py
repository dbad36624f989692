"""How often the fast path's decode attention gives the canonical pass's bits, per canonical kernel (CUDA only).

A deterministic request's fast-path token is rolled back when it differs from
the canonical pass's; the closer the fast path's arithmetic is to the canonical
pass's, the rarer that is. This measures one source of difference directly:
for decode rows (one query row per sequence, random paged K/V, contexts drawn
in [--min-context, --max-context]) it compares, bit for bit,

- the fast decode kernel (``paged_decode_attention``) with one KV split (what a
  large decode batch runs) and with the split count it picks for the batch,
- the canonical row kernel (``canonical_attention``, ``attention_kernel="rows"``),
- the canonical tiled kernel (``tiled_canonical_attention``, the default),
- ``FastPolicy(decode_kernel="canonical")``'s launch of it, one row per tile
  (``tiled_canonical_decode_attention``),
- the tiled canonical launch compiled with FMA contraction (``fp_fusion=True``;
  the canonical launch disables it, the row and decode kernels do not), packed,
  one row per tile, and as the last row of an 8-row verify window (the
  unfused kernel in that window too),

and reports, per pair, the share of output elements and of whole rows
(all heads) that are bit-identical, and the largest difference.

    PYTHONPATH=src python3 benchmarks/device/attention_agreement.py --out agreement.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

SHAPES = {"smollm2": (9, 3, 64), "llama8b": (32, 8, 128)}  # query heads, kv heads, head dim


def _tiled_fused(q, k, v, positions, row_seq, tables, block_size, scale, *, rows_per_tile=None):
    from llm42.kernels import tiled_attention as ta

    warps, stages = ta.CANONICAL_LAUNCH[ta.CANONICAL_TILE_M]
    return ta._launch(q, k, v, positions, row_seq, tables, block_size=block_size, scale=scale, sliding_window=None,
                      block_m=ta.CANONICAL_TILE_M, block_n=64, num_warps=warps,
                      num_stages=stages, is_canonical=True, rows_per_tile=rows_per_tile,
                      fp_fusion=True)


def _case(num_heads: int, num_kv_heads: int, head_dim: int, *, batch: int, min_context: int, max_context: int,
          block_size: int, dtype: torch.dtype, seed: int) -> dict:
    from llm42 import kernels

    gen = torch.Generator(device="cuda").manual_seed(seed)
    contexts = torch.randint(min_context, max_context + 1, (batch,), generator=gen, device="cuda")
    blocks_per_seq = -(-max_context // block_size)
    num_slots = batch * blocks_per_seq * block_size
    k = torch.randn(num_slots, num_kv_heads, head_dim, generator=gen, device="cuda").to(dtype)
    v = torch.randn(num_slots, num_kv_heads, head_dim, generator=gen, device="cuda").to(dtype)
    tables = torch.randperm(batch * blocks_per_seq, generator=gen, device="cuda").view(batch, blocks_per_seq)
    q = torch.randn(batch, num_heads, head_dim, generator=gen, device="cuda").to(dtype)
    scale = head_dim ** -0.5
    positions = contexts - 1
    rows = torch.arange(batch, device="cuda")
    max_ctx = int(contexts.max())
    out = {
        "fast_1split": kernels.paged_decode_attention(q, k, v, tables, contexts, block_size=block_size, scale=scale,
                                                      num_splits=1),
        "fast_auto": kernels.paged_decode_attention(q, k, v, tables, contexts, block_size=block_size, scale=scale,
                                                    max_context_len=max_ctx),
        "canonical_rows": kernels.canonical_attention(q, k, v, positions, rows, tables, block_size=block_size,
                                                      scale=scale, key_block=64),
        "canonical_tiled": kernels.tiled_canonical_attention(q, k, v, positions, rows, tables,
                                                             block_size=block_size, scale=scale, key_block=64),
        "fast_canonical_decode": kernels.tiled_canonical_decode_attention(q, k, v, tables, contexts,
                                                                          block_size=block_size, scale=scale),
        # the canonical tiled launch compiled with FMA contraction (as the row and decode kernels are)
        "canonical_tiled_fused": _tiled_fused(q, k, v, positions, rows, tables, block_size, scale),
        "canonical_tiled_fused_1row": _tiled_fused(q, k, v, positions, rows, tables, block_size, scale,
                                                   rows_per_tile=1),
    }
    # each row again as the last row of an 8-row verify window of its own sequence (static layout), fused
    window_rows = []
    for b in range(batch):
        pos = int(positions[b])
        window_rows += [(b, p) for p in range(max(0, pos - 7), pos + 1)]
    last = torch.tensor([i for i in range(len(window_rows)) if i + 1 == len(window_rows)
                         or window_rows[i + 1][0] != window_rows[i][0]], device="cuda")
    wq = torch.randn(len(window_rows), num_heads, head_dim, generator=gen, device="cuda").to(dtype)
    wq[last] = q
    wpos = torch.tensor([p for _, p in window_rows], device="cuda")
    wseq = torch.tensor([s for s, _ in window_rows], device="cuda")
    first = {}
    wrow_seq = torch.tensor([first.setdefault(s, i) for i, (s, _) in enumerate(window_rows)], device="cuda")
    out["canonical_tiled_fused_window"] = _tiled_fused(wq, k, v, wpos, wrow_seq, tables[wseq], block_size,
                                                       scale)[last]
    out["canonical_tiled_window"] = kernels.tiled_canonical_attention(wq, k, v, wpos, wrow_seq, tables[wseq],
                                                                      block_size=block_size, scale=scale,
                                                                      key_block=64)[last]
    torch.cuda.synchronize()
    splits = kernels.choose_num_splits(batch, num_kv_heads, max_ctx, num_sms=kernels.num_sms(q.device))
    pairs = {}
    names = list(out)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            same = out[a].view(torch.int16) == out[b].view(torch.int16)
            pairs[f"{a}~{b}"] = {
                "elements_identical": float(same.float().mean()),
                "rows_identical": float(same.flatten(1).all(dim=1).float().mean()),
                "max_abs_diff": float((out[a].float() - out[b].float()).abs().max()),
            }
    return {"batch": batch, "contexts": [min_context, max_context], "fast_auto_splits": splits, "pairs": pairs}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("attention_agreement.json"))
    p.add_argument("--batches", default="8,256")
    p.add_argument("--min-context", type=int, default=40)
    p.add_argument("--max-context", type=int, default=1500)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("attention_agreement: needs a CUDA device", file=sys.stderr)
        return 2
    results = {"device": torch.cuda.get_device_name(), "dtype": "bfloat16", "cases": {}}
    for name, (hq, hkv, d) in SHAPES.items():
        for batch in (int(b) for b in args.batches.split(",")):
            case = _case(hq, hkv, d, batch=batch, min_context=args.min_context, max_context=args.max_context,
                         block_size=16, dtype=torch.bfloat16, seed=batch)
            results["cases"][f"{name}_b{batch}"] = case
            for pair, got in case["pairs"].items():
                print(f"{name} batch {batch} (auto splits {case['fast_auto_splits']}) {pair}: "
                      f"elements {got['elements_identical']:.4f}, rows {got['rows_identical']:.4f}, "
                      f"max |diff| {got['max_abs_diff']:.3g}")
    args.out.write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
