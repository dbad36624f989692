"""Does the canonical tiled attention's tile height change a row's bits? And what does each height cost?

    PYTHONPATH=src:. python3 benchmarks/device/tile_m_bits.py --out tile_m.json

The canonical launch (``tiled_canonical_attention``: 64 M-rows, 4 warps, 2 stages, key blocks of 64) is part
of the canonical config. Each variant below is the same kernel at another tile height / warp count, run as the
canonical launch is (no FMA contraction, the same key blocks): decode rows one per tile (as
``tiled_canonical_decode_attention`` runs them), verify windows and a long prompt chunk as many rows per tile
as the height holds. Per shape and dtype: whether every row's output is bit-identical to the canonical
launch's (and how many rows differ otherwise), with the split-KV decode kernel as the control (another
reduction: some rows differ). Then device times (CUDA events, median of 20 after warm-up, inputs staged
beforehand) of decode batches: the split-KV kernel (its own split count, and one split), the canonical decode
launch (``tiled_canonical_decode_attention``: one row in a tile of the canonical launch's 64 M-rows) and the same
row in a 16-row tile on one warp, and ``FastPolicy(decode_kernel="deterministic")``'s pair of launches at 10 % and
50 % deterministic rows; and of a long prompt chunk at several heights, warps and stages.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO))

from tests.triton_cpu import enable as _interpret  # noqa: E402

_interpret()  # Triton's interpreter without CUDA (the --smoke run on a CPU): before any kernel is defined
from llm42.bench.devicetime import median_ms  # noqa: E402
from llm42.kernels import paged_decode_attention, tiled_canonical_attention  # noqa: E402
from llm42.kernels.tiled_attention import CANONICAL_TILE_STAGES as CANONICAL_STAGES, _launch  # noqa: E402
from tests.tiled_attention_checks import Cache  # noqa: E402

SHAPES = {  # (num_heads, num_kv_heads, head_dim)
    "smollm2": (9, 3, 64),
    "8b": (32, 8, 128),
    "gqa8": (16, 2, 128),
    "mha": (8, 8, 64),
}
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# (block_m, warps, stages). Round 17's call B ran (16, 1 | 2 | 4, 2), (32, 2 | 4, 2), (64, 4 | 8, 2), (128, 4 | 8, 2);
# call C: the narrow decode tile and the canonical height at more stages
VARIANTS = [(16, 1, 2), (16, 1, 3), (16, 1, 4), (64, 4, 3), (128, 4, 3), (128, 8, 2)]


def variant_run(cache: Cache, rows, variant, *, one_per_tile: bool) -> torch.Tensor:
    block_m, warps, stages = variant
    groups = cache.num_heads // cache.k.shape[1]
    q, positions, row_seq, tables = cache.layout(rows, static=False)
    return _launch(q, cache.k, cache.v, positions, row_seq, tables, block_size=cache.block_size, scale=cache.scale,
                   sliding_window=None, block_m=block_m, block_n=64, num_warps=warps, num_stages=stages,
                   is_canonical=True, rows_per_tile=1 if one_per_tile else block_m // groups)


def row_sets(cache: Cache, rng: random.Random) -> dict[str, list[tuple[int, int]]]:
    seqs = range(cache.num_seqs)
    decode = [(s, rng.randrange(cache.max_context)) for s in seqs for _ in range(4)]
    windows = []
    for s in seqs:
        start = rng.randrange(cache.max_context - 32)
        windows += [(s, p) for p in range(start, start + rng.randint(1, 32))]
    chunk = [(0, p) for p in range(max(0, cache.max_context - 700), cache.max_context - 1)]
    return {"decode": decode, "windows": windows, "chunk": chunk}


def bits_check(args) -> dict:
    out = {}
    for shape_name, (heads, kv_heads, dim) in SHAPES.items():
        groups = heads // kv_heads
        for dtype in (torch.bfloat16, torch.float16):
            cache = Cache(num_seqs=2 if args.smoke else 6, max_context=100 if args.smoke else 2500, num_heads=heads,
                          num_kv_heads=kv_heads, head_dim=dim, block_size=16, dtype=dtype, device=DEVICE, seed=7)
            rng = random.Random(11)
            sets = row_sets(cache, rng)
            refs = {name: cache.run(tiled_canonical_attention, rows) for name, rows in sets.items()}
            # the control: the split-KV decode kernel at one split, another reduction of the same rows
            q, positions, row_seq, tables = cache.layout(sets["decode"], static=False)
            split = paged_decode_attention(q, cache.k, cache.v, tables[row_seq], positions + 1,
                                           block_size=cache.block_size, scale=cache.scale, num_splits=1)
            control = (split.view(torch.int16) != refs["decode"].view(torch.int16)).flatten(1).any(1)
            out[f"{shape_name}/{str(dtype).split('.')[-1]}/control_split_kernel"] = {
                "decode": {"rows": len(sets["decode"]), "rows_differing": int(control.sum())}}
            for variant in VARIANTS:
                if variant[0] < groups:
                    continue
                key = f"{shape_name}/{str(dtype).split('.')[-1]}/m{variant[0]}w{variant[1]}s{variant[2]}"
                res = {}
                for name, rows in sets.items():
                    for one in ((True, False) if name == "decode" else (False,)):
                        got = variant_run(cache, rows, variant, one_per_tile=one)
                        ref = refs[name]
                        diff = (got.view(torch.int16) != ref.view(torch.int16)).flatten(1).any(1)
                        res[f"{name}{'_one' if one else ''}"] = {
                            "rows": len(rows), "rows_differing": int(diff.sum()),
                            "max_abs": float((got.float() - ref.float()).abs().max())}
                out[key] = res
                print(key, {k: v["rows_differing"] for k, v in res.items()}, flush=True)
    return out


def timings(args) -> dict:
    """Device times with every input staged beforehand (the launch alone between the events)."""
    from llm42.kernels import tiled_canonical_decode_attention

    device = torch.device(DEVICE)
    out = {}
    cases = [("smollm2", 256, 600), ("smollm2", 256, 2400), ("smollm2", 64, 2400), ("8b", 128, 1000),
             ("8b", 256, 600)]
    chunks = (("8b", 2048, 4096), ("smollm2", 2048, 4096))
    if args.smoke:
        cases, chunks = [("smollm2", 4, 100)], (("smollm2", 20, 40),)
    for shape_name, batch, context in cases:
        heads, kv_heads, dim = SHAPES[shape_name]
        cache = Cache(num_seqs=batch, max_context=context + 64, num_heads=heads, num_kv_heads=kv_heads,
                      head_dim=dim, block_size=16, dtype=torch.bfloat16, device=DEVICE, seed=3)
        rng = random.Random(5)
        rows = [(s, rng.randrange(context // 2, context)) for s in range(batch)]
        q, positions, row_seq, tables = cache.layout(rows, static=False)
        lens = positions + 1
        common = dict(block_size=16, scale=cache.scale)

        def split(num_splits=None, skip=None, out=None):
            return paged_decode_attention(q, cache.k, cache.v, tables, lens, max_context_len=context + 64,
                                          num_splits=num_splits, skip_rows=skip, out=out, **common)

        def canonical(only=None, out=None):  # the decode launch: one row in a tile of the canonical launch's height
            return tiled_canonical_decode_attention(q, cache.k, cache.v, tables, lens, key_block=64, only_rows=only,
                                                    out=out, **common)

        def narrow():  # one row in a 16-row tile on one warp (the same bits in call B)
            return _launch(q, cache.k, cache.v, positions, row_seq, tables, sliding_window=None, block_m=16,
                           block_n=64, num_warps=1, num_stages=CANONICAL_STAGES, is_canonical=True, rows_per_tile=1,
                           **common)

        res = {"split": median_ms(split, device), "split_1": median_ms(lambda: split(1), device),
               "canonical_decode": median_ms(canonical, device),
               "canonical_decode_m16w1": median_ms(narrow, device)}
        buf = torch.empty_like(q)
        for share in (0.1, 0.5):
            flags = torch.tensor([rng.random() < share for _ in rows], dtype=torch.int8, device=DEVICE)

            def pair(flags=flags):  # FastPolicy(decode_kernel="deterministic")'s two launches, in turn
                split(skip=flags, out=buf)
                canonical(only=flags, out=buf)
            res[f"det_rows_{int(share * 100)}pct"] = median_ms(pair, device)
        key = f"decode/{shape_name}/b{batch}/ctx{context}"
        out[key] = {k: round(v, 4) for k, v in res.items()}
        print(key, out[key], flush=True)
    for shape_name, num_rows, start in chunks:
        heads, kv_heads, dim = SHAPES[shape_name]
        cache = Cache(num_seqs=1, max_context=start + num_rows, num_heads=heads, num_kv_heads=kv_heads, head_dim=dim,
                      block_size=16, dtype=torch.bfloat16, device=DEVICE, seed=3)
        rows = [(0, p) for p in range(start, start + num_rows)]
        q, positions, row_seq, tables = cache.layout(rows, static=False)
        res = {}
        for block_m, warps, stages in [(64, 4, 2), (128, 4, 2), (128, 8, 2), (64, 4, 3), (128, 4, 3)]:
            res[f"m{block_m}w{warps}s{stages}"] = median_ms(lambda b=block_m, w=warps, st=stages: _launch(
                q, cache.k, cache.v, positions, row_seq, tables, block_size=16, scale=cache.scale,
                sliding_window=None, block_m=b, block_n=64, num_warps=w, num_stages=st, is_canonical=True),
                device)
        key = f"chunk/{shape_name}/{num_rows}rows_at_{start}"
        out[key] = {k: round(v, 4) for k, v in res.items()}
        print(key, out[key], flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes (a check of the script, e.g. on a CPU)")
    ap.add_argument("--timings-only", action="store_true", help="skip the bit comparisons")
    args = ap.parse_args()
    result = {"device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu", "torch": torch.__version__,
              "variants": VARIANTS, "canonical_stages": CANONICAL_STAGES}
    if not args.timings_only:
        result["bits"] = bits_check(args)
        Path(args.out).write_text(json.dumps(result, indent=1))
    result["ms"] = timings(args)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
