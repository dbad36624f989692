"""Why the engine's tiled attention trails a minimal kernel on a long prompt's chunks: one change at a time.

    PYTHONPATH=src python3 benchmarks/device/tile_ablation.py --out ablation.json [--lengths 15000,8192]
        [--chunk 2048] [--reps 5] [--budget-s 300]

The problem of ``attention_ceiling.py`` (Llama-3.1-8B shape, bf16, one prompt in 2,048-row chunks, pages of 16 in a
shuffled block table). Runs, each summed over the prompt's chunks (CUDA events, median of ``--reps``):

- ``min_*``: the minimal paged kernel (page ids one block ahead) as it is, with the engine's GQA packing (one kv
  head's query heads in one tile), without FMA contraction (the canonical launch's ``enable_fp_fusion=False``),
  and both;
- ``r19_*`` / ``new_*``: the engine kernel, round 19's (``--baseline``, a copy of 56037d0's module) and this
  tree's, fast and canonical arithmetic per configuration, this tree's also with ``one_group`` (the launch
  promises one sequence per tile) and page ids ahead (``pf``);
- ``cudnn_*`` (``--cudnn``): PyTorch's cuDNN attention on the chunk's keys gathered from the paged cache (the prefix
  without a mask and the chunk's own keys causal, merged by their log-sum-exps; or one call with an additive mask).

``bits``: whether this tree's canonical launches give round 19's bits on every chunk (page ids ahead, more stages,
8 warps at the 128-row tile, one_group); ``bits_against_r19``: the same on the GPU suite's shapes and mixed
launches (every dtype, windows, varlen and static layouts, the tile table). Registers and spills of every compiled
binary. Round 19's module: ``git show 56037d0:src/llm42/kernels/tiled_attention.py >
benchmarks/device/baseline_r19/tiled_attention_r19.py`` before the call (untracked, it travels with the tree).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import triton

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "benchmarks" / "device"))
sys.path.insert(0, str(REPO))  # tests.* (the GPU suite's shapes and checks)

from attention_ceiling import (  # noqa: E402
    HEAD_DIM, PAGE, _causal_kernel, chunk_flops, compiled_resources, long_prompt, paged_attention,
)

from llm42.bench.devicetime import median_ms  # noqa: E402
from llm42.kernels import tiled_attention as tiled  # noqa: E402

MIN_CONFIGS = [(64, 64, 4, 3)]
# (name, module, block_m, block_n, warps, stages, canonical, one_group, prefetch): module "r19" is round 19's kernel
# (``--baseline``: a copy of 56037d0's src/llm42/kernels/tiled_attention.py), "new" this tree's
ENGINE_RUNS = [
    ("r19_fast_64x64x4x2", "r19", 64, 64, 4, 2, False, False, None),
    ("new_fast_64x64x4x2", "new", 64, 64, 4, 2, False, False, None),
    ("new_fast_64x64x4x3_pf", "new", 64, 64, 4, 3, False, False, True),
    ("new_fast_64x64x4x3_pf_onegroup", "new", 64, 64, 4, 3, False, True, True),
    ("r19_fast_128x64x8x3", "r19", 128, 64, 8, 3, False, False, None),
    ("new_fast_128x64x8x3", "new", 128, 64, 8, 3, False, False, None),
    ("r19_fast_128x128x8x3", "r19", 128, 128, 8, 3, False, False, None),
    ("new_fast_128x128x8x3", "new", 128, 128, 8, 3, False, False, None),
    ("new_fast_128x128x8x3_onegroup", "new", 128, 128, 8, 3, False, True, None),
    ("new_fast_256x64x8x3", "new", 256, 64, 8, 3, False, False, None),
    ("r19_canon_t64_4w2s", "r19", 64, 64, 4, 2, True, False, None),
    ("new_canon_t64_4w2s", "new", 64, 64, 4, 2, True, False, None),
    ("new_canon_t64_4w3s_pf", "new", 64, 64, 4, 3, True, False, True),
    ("new_canon_t64_4w3s_pf_onegroup", "new", 64, 64, 4, 3, True, True, True),
    ("r19_canon_t128_4w2s", "r19", 128, 64, 4, 2, True, False, None),
    ("new_canon_t128_4w2s", "new", 128, 64, 4, 2, True, False, None),
    ("new_canon_t128_8w3s", "new", 128, 64, 8, 3, True, False, None),
    ("new_canon_t128_8w3s_onegroup", "new", 128, 64, 8, 3, True, True, None),
    ("new_canon_t128_8w2s", "new", 128, 64, 8, 2, True, False, None),
    ("new_canon_t64_launch", "launch", 64),  # tiled_canonical_attention as the canonical pass calls it (tiles)
    ("new_canon_t128_launch", "launch", 128),
]
# the canonical runs whose bits are compared with round 19's launch at the same tile height
BITS_BASE = {"new_canon_t64": "r19_canon_t64_4w2s", "new_canon_t128": "r19_canon_t128_4w2s"}
MODULES = {"new": tiled}
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def load_baseline(path: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location("tiled_attention_r19", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def engine_run(q, k_paged, v_paged, pos, seq, table, spec):
    if spec[1] == "launch":  # the canonical launch with the tile table the canonical pass stages (one sequence)
        rows_per_tile = spec[2] // (q.shape[1] // k_paged.shape[1])
        tiles = torch.arange(0, q.shape[0] + rows_per_tile, rows_per_tile, device=q.device).clamp_(max=q.shape[0])
        return tiled.tiled_canonical_attention(q, k_paged, v_paged, pos, seq, table, block_size=PAGE,
                                               scale=HEAD_DIM ** -0.5, tile_m=spec[2], tiles=tiles, kv_tma=False)
    _, module, block_m, block_n, warps, stages, canonical, one_group, prefetch = spec
    extra = {} if module == "r19" else {"one_group": one_group, "prefetch": prefetch}
    return MODULES[module]._launch(q, k_paged, v_paged, pos, seq, table, block_size=PAGE, scale=HEAD_DIM ** -0.5,
                                   sliding_window=None, block_m=block_m, block_n=block_n, num_warps=warps,
                                   num_stages=stages, is_canonical=canonical, kv_tma=False, **extra)


def bits_against_baseline(seeds: int, num_shapes: int = 4) -> dict:
    """This tree's canonical launch against round 19's on the GPU suite's shapes and mixed launches (prompt chunks
    and lone rows, windows, varlen and static layouts, the tile table): whether every output has the same bits."""
    import random

    import numpy as np

    from llm42.cuda_graphs import tile_starts
    from tests.gpu.test_tiled_attention import SHAPES, cache_for
    from tests.tiled_attention_checks import mixed_rows

    results = {}
    for shape in SHAPES[:num_shapes]:
        for dtype in DTYPES:
            same = compared = control = control_same = 0
            for seed in range(seeds):
                cache = cache_for(shape, dtype, seed)
                rng = random.Random(seed)
                rows = mixed_rows(cache, rng, num_chunks=4, num_decode=8)
                groups = shape[0] // shape[1]
                for static in (False, True):
                    q, positions, row_seq, tables = cache.layout(rows, static=static)
                    for tile_m in (64, 128):
                        for key_block in (16, 64):
                            common = dict(block_size=cache.block_size, scale=cache.scale, sliding_window=shape[5],
                                          key_block=key_block, tile_m=tile_m, kv_tma=False)
                            args = (q, cache.k, cache.v, positions, row_seq, tables)
                            old = MODULES["r19"].tiled_canonical_attention(*args, **common)
                            variants = [tiled.tiled_canonical_attention(*args, **common)]
                            if static:  # the canonical pass's layout and tile table
                                ids = row_seq.cpu().numpy().astype(np.int64)
                                tiles = torch.from_numpy(tile_starts(ids, tile_m // groups, len(rows))).to(q.device)
                                variants.append(tiled.tiled_canonical_attention(*args, tiles=tiles, **common))
                            # the negative control: the fast launch (FMA contraction) on the same rows
                            fast = tiled._launch(*args, block_size=cache.block_size, scale=cache.scale,
                                                 sliding_window=shape[5], block_m=tile_m, block_n=key_block,
                                                 num_warps=4, num_stages=2, is_canonical=False, kv_tma=False)
                            control += 1
                            control_same += bool(torch.equal(old, fast))
                            for new in variants:
                                compared += 1
                                same += bool(torch.equal(old, new) and torch.equal(old.signbit(), new.signbit()))
                        # decode rows (one per sequence, the fast path's canonical decode launch)
                        if not static:
                            lens = torch.tensor([rng.randrange(1, cache.max_context + 1)
                                                 for _ in range(cache.num_seqs)], device=q.device)
                            dq = torch.stack([cache.query(s, int(n) - 1) for s, n in enumerate(lens.tolist())]).to(
                                device=q.device, dtype=dtype)
                            dargs = (dq, cache.k, cache.v, cache.tables, lens)
                            dkw = dict(block_size=cache.block_size, scale=cache.scale, sliding_window=shape[5],
                                       tile_m=tile_m)
                            old = MODULES["r19"].tiled_canonical_decode_attention(*dargs, **dkw)
                            new = tiled.tiled_canonical_decode_attention(*dargs, **dkw)
                            compared += 1
                            same += bool(torch.equal(old, new) and torch.equal(old.signbit(), new.signbit()))
            key = "x".join(str(v) for v in shape) + f"_{str(dtype).split('.')[-1]}"
            results[key] = {"compared": compared, "same_bits": same, "control_fast_launch": control,
                            "control_same_bits": control_same}
            print(f"bits vs r19 {key}: {same}/{compared} (control, the fast launch: {control_same}/{control})",
                  flush=True)
    return results


def cudnn_split(q, k_all, v_all, lo, hi):
    """The chunk's rows [lo, hi) over keys [0, hi): the prefix [0, lo) unmasked and [lo, hi) causal, each through
    cuDNN with its log-sum-exp, merged."""
    op = torch.ops.aten._scaled_dot_product_cudnn_attention
    qh = q.transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
    own_k = k_all[lo:hi].transpose(0, 1).unsqueeze(0)
    own_v = v_all[lo:hi].transpose(0, 1).unsqueeze(0)
    out_c, lse_c = op(qh, own_k, own_v, None, True, 0.0, True, False, scale=HEAD_DIM ** -0.5)[:2]
    if lo == 0:
        return out_c[0].transpose(0, 1)
    pre_k = k_all[:lo].transpose(0, 1).unsqueeze(0)
    pre_v = v_all[:lo].transpose(0, 1).unsqueeze(0)
    out_p, lse_p = op(qh, pre_k, pre_v, None, True, 0.0, False, False, scale=HEAD_DIM ** -0.5)[:2]
    lse_c = lse_c.reshape(out_c.shape[:3]).float()
    lse_p = lse_p.reshape(out_p.shape[:3]).float()
    lse = torch.logaddexp(lse_c, lse_p)
    out = out_c.float() * torch.exp(lse_c - lse)[..., None] + out_p.float() * torch.exp(lse_p - lse)[..., None]
    return out[0].transpose(0, 1).to(q.dtype)


def cudnn_masked(q, k_all, v_all, lo, hi, masks):
    """One cuDNN call over keys [0, hi) with an additive causal mask (bottom-right)."""
    op = torch.ops.aten._scaled_dot_product_cudnn_attention
    qh = q.transpose(0, 1).unsqueeze(0)
    kh = k_all[:hi].transpose(0, 1).unsqueeze(0)
    vh = v_all[:hi].transpose(0, 1).unsqueeze(0)
    out = op(qh, kh, vh, masks[(lo, hi)], False, 0.0, False, False, scale=HEAD_DIM ** -0.5)[0]
    return out[0].transpose(0, 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--lengths", default="15000,8192")
    ap.add_argument("--chunk", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--budget-s", type=float, default=300.0)
    ap.add_argument("--baseline",
                    default=str(REPO / "benchmarks" / "device" / "baseline_r19" / "tiled_attention_r19.py"))
    ap.add_argument("--bits-seeds", type=int, default=3)
    ap.add_argument("--bits-shapes", type=int, default=4, help="the first N of the GPU suite's shapes")
    ap.add_argument("--bits-dtypes", default="bfloat16,float16,float32")
    ap.add_argument("--cudnn", action="store_true", help="also the cuDNN runs (round 20 call A)")
    args = ap.parse_args()
    MODULES["r19"] = load_baseline(args.baseline)
    global DTYPES
    DTYPES = tuple(getattr(torch, name) for name in args.bits_dtypes.split(","))
    t_start = time.time()
    dev, dtype = torch.device("cuda"), torch.bfloat16
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "chunk": args.chunk, "reps": args.reps, "lengths": []}
    for length in (int(x) for x in args.lengths.split(",")):
        q_all, k, v, k_paged, v_paged, slots, table, table_padded = long_prompt(length, dev, dtype)
        chunks = [(lo, min(lo + args.chunk, length)) for lo in range(0, length, args.chunk)]
        staged = [(q_all[lo:hi].contiguous(), torch.arange(lo, hi, device=dev),
                   torch.zeros(hi - lo, dtype=torch.int64, device=dev), lo, hi) for lo, hi in chunks]
        total_flops = sum(chunk_flops(lo, hi) for lo, hi in chunks)
        runs = {}
        for config in MIN_CONFIGS:
            for gqa in (False, True):
                for fusion in (True, False):
                    name = ("min_" + "x".join(map(str, config)) + ("_gqa" if gqa else "")
                            + ("" if fusion else "_nofusion"))
                    runs[name] = (lambda q, p, s, lo, hi, config=config, gqa=gqa, fusion=fusion:
                                  paged_attention(q, k_paged, v_paged, table_padded, hi, config, True, gqa, fusion))
        for spec in ENGINE_RUNS:
            runs[spec[0]] = (lambda q, p, s, lo, hi, spec=spec: engine_run(q, k_paged, v_paged, p, s, table, spec))

        def gathered(hi):  # the chunk's keys [0, hi) read out of the paged cache, as the engine would hand them over
            idx = slots[:hi]
            return k_paged.index_select(0, idx), v_paged.index_select(0, idx)

        if args.cudnn:
            runs["cudnn_split_gather"] = lambda q, p, s, lo, hi: cudnn_split(q, *gathered(hi), lo, hi)
            runs["cudnn_split_contiguous"] = lambda q, p, s, lo, hi: cudnn_split(q, k, v, lo, hi)
            masks = {}
            for lo, hi in chunks:
                rows = torch.arange(lo, hi, device=dev)[:, None]
                keys = torch.arange(hi, device=dev)[None, :]
                masks[(lo, hi)] = torch.zeros(hi - lo, hi, device=dev, dtype=dtype).masked_fill(
                    keys > rows, float("-inf")).view(1, 1, hi - lo, hi)
            runs["cudnn_mask_contiguous"] = lambda q, p, s, lo, hi: cudnn_masked(q, k, v, lo, hi, masks)
        entry = {"length": length, "attention_TFLOP": round(total_flops / 1e12, 4), "runs": {}, "bits": {}}
        reference = torch.cat([engine_run(q, k_paged, v_paged, p, s, table, ENGINE_RUNS[5])
                               for q, p, s, lo, hi in staged]).float()
        outputs = {}
        for name, fn in runs.items():
            if time.time() - t_start > args.budget_s:
                entry["runs"][name] = {"skipped": "budget"}
                continue
            t0 = time.time()
            kernels = (tiled._tiled_attention_kernel, MODULES["r19"]._tiled_attention_kernel, _causal_kernel)
            seen = {kern: len(compiled_resources(kern)) for kern in kernels}
            try:
                outs = [fn(*st) for st in staged]
                per_chunk = [median_ms(lambda: fn(*st), dev, warmup=2, reps=args.reps) for st in staged]  # noqa: B023
            except Exception as exc:
                entry["runs"][name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
                print(f"L={length:6d} {name:30s} {entry['runs'][name]['error']}", flush=True)
                continue
            if "_canon_" in name:
                outputs[name] = outs
            total = sum(per_chunk)
            err = float((torch.cat(outs).float() - reference).abs().max())
            binaries = [b for kern, n in seen.items() for b in compiled_resources(kern)[n:]]
            entry["runs"][name] = {"total_ms": round(total, 4), "TFLOPs": round(total_flops / total / 1e9, 1),
                                   "max_abs_diff_vs_new_fast_128x64x8x3": err, "wall_s": round(time.time() - t0, 1),
                                   "new_binaries": binaries}
            print(f"L={length:6d} {name:30s} {total:8.3f} ms {total_flops / total / 1e9:6.1f} TFLOP/s "
                  f"(max |diff| {err:.2e}; {time.time() - t0:.0f} s) "
                  f"{[(b.get('n_regs'), b.get('n_spills')) for b in binaries]}", flush=True)
        for name, outs in outputs.items():
            if name.startswith("r19_"):
                continue
            base = next(b for prefix, b in BITS_BASE.items() if name.startswith(prefix + "_"))
            if name != base and base in outputs:
                entry["bits"][f"{name} == {base}"] = all(torch.equal(a, b) for a, b in zip(outs, outputs[base]))
        print(f"L={length:6d} bits: {json.dumps(entry['bits'])}", flush=True)
        result["lengths"].append(entry)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    result["bits_against_r19"] = bits_against_baseline(args.bits_seeds, args.bits_shapes)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    result["resources"] = {"engine_tiled_kernel": compiled_resources(tiled._tiled_attention_kernel),
                           "minimal_kernel": compiled_resources(_causal_kernel)}
    print(json.dumps(result["resources"]), flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
