"""Why the engine's tiled attention trails a minimal kernel on a long prompt's chunks: one change at a time.

    PYTHONPATH=src python3 benchmarks/device/tile_ablation.py --out ablation.json [--lengths 15000,8192]
        [--chunk 2048] [--reps 5] [--budget-s 300]

The problem of ``attention_ceiling.py`` (Llama-3.1-8B shape, bf16, one prompt in 2,048-row chunks, pages of 16 in a
shuffled block table). Runs, each summed over the prompt's chunks (CUDA events, median of ``--reps``):

- ``min_*``: the minimal paged kernel (page ids one block ahead) as it is, with the engine's GQA packing (one kv
  head's query heads in one tile), without FMA contraction (the canonical launch's ``enable_fp_fusion=False``),
  and both;
- ``fast_*`` / ``canon_*``: the engine kernel's fast and canonical arithmetic, per configuration, with its group
  loop (the generic tile) or ``one_group`` (the launch promises one sequence per tile), page ids ahead or not;
- ``cudnn_*``: PyTorch's cuDNN attention on the chunk's keys gathered from the paged cache (the prefix without a
  mask and the chunk's own keys causal, merged by their log-sum-exps; or one call with an additive mask).

``bits``: whether variants of the canonical launch give the generic launch's bits on every chunk (one_group,
page ids ahead, more stages, 8 warps at the 128-row tile). Registers and spills of every compiled binary.
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

from attention_ceiling import (  # noqa: E402
    HEAD_DIM, NUM_HEADS, NUM_KV_HEADS, PAGE, _causal_kernel, chunk_flops, compiled_resources, paged_attention,
)

from llm42.bench.devicetime import median_ms  # noqa: E402
from llm42.kernels import tiled_attention as tiled  # noqa: E402

MIN_CONFIGS = [(64, 64, 4, 3), (128, 64, 8, 3)]
# (name, block_m, block_n, warps, stages, canonical, one_group, prefetch)
ENGINE_RUNS = [
    ("fast_64x64x4x3", 64, 64, 4, 3, False, False, None),
    ("fast_64x64x4x3_onegroup", 64, 64, 4, 3, False, True, None),
    ("fast_64x64x4x3_pf", 64, 64, 4, 3, False, False, True),
    ("fast_64x64x4x3_onegroup_pf", 64, 64, 4, 3, False, True, True),
    ("fast_128x64x8x3", 128, 64, 8, 3, False, False, None),
    ("fast_128x64x8x3_onegroup", 128, 64, 8, 3, False, True, None),
    ("fast_128x128x8x3", 128, 128, 8, 3, False, False, None),
    ("fast_128x128x8x3_onegroup", 128, 128, 8, 3, False, True, None),
    ("canon_t64_4w2s", 64, 64, 4, 2, True, False, None),
    ("canon_t64_4w2s_onegroup", 64, 64, 4, 2, True, True, None),
    ("canon_t64_4w2s_onegroup_pf", 64, 64, 4, 2, True, True, True),
    ("canon_t64_4w3s_onegroup_pf", 64, 64, 4, 3, True, True, True),
    ("canon_t128_4w2s", 128, 64, 4, 2, True, False, None),
    ("canon_t128_4w2s_onegroup", 128, 64, 4, 2, True, True, None),
    ("canon_t128_8w2s_onegroup", 128, 64, 8, 2, True, True, None),
    ("canon_t128_8w3s_onegroup", 128, 64, 8, 3, True, True, None),
    ("canon_t128_8w3s", 128, 64, 8, 3, True, False, None),
]
# the canonical variants whose bits are compared with the generic launch's at the same tile height
BITS_BASE = {"canon_t64": "canon_t64_4w2s", "canon_t128": "canon_t128_4w2s"}


def engine_run(q, k_paged, v_paged, pos, seq, table, spec):
    _, block_m, block_n, warps, stages, canonical, one_group, prefetch = spec
    return tiled._launch(q, k_paged, v_paged, pos, seq, table, block_size=PAGE, scale=HEAD_DIM ** -0.5,
                         sliding_window=None, block_m=block_m, block_n=block_n, num_warps=warps,
                         num_stages=stages, is_canonical=canonical, one_group=one_group, prefetch=prefetch,
                         kv_tma=False)


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
    args = ap.parse_args()
    t_start = time.time()
    dev, dtype = torch.device("cuda"), torch.bfloat16
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "chunk": args.chunk, "reps": args.reps, "lengths": []}
    for length in (int(x) for x in args.lengths.split(",")):
        gen = torch.Generator().manual_seed(length)
        q_all = torch.randn(length, NUM_HEADS, HEAD_DIM, generator=gen).to(dev, dtype)
        k = torch.randn(length, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(dev, dtype)
        v = torch.randn(length, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(dev, dtype)
        num_blocks = -(-length // PAGE)
        perm = torch.randperm(num_blocks, generator=gen).to(dev)
        k_paged = torch.zeros(num_blocks * PAGE, NUM_KV_HEADS, HEAD_DIM, device=dev, dtype=dtype)
        v_paged = torch.zeros_like(k_paged)
        slots = perm[torch.arange(length, device=dev) // PAGE] * PAGE + torch.arange(length, device=dev) % PAGE
        k_paged[slots], v_paged[slots] = k, v
        table = perm.view(1, -1)
        table_padded = torch.cat([perm, perm.new_zeros(8)])
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
        reference = torch.cat([engine_run(q, k_paged, v_paged, p, s, table, ENGINE_RUNS[4])
                               for q, p, s, lo, hi in staged]).float()
        outputs = {}
        for name, fn in runs.items():
            if time.time() - t_start > args.budget_s:
                entry["runs"][name] = {"skipped": "budget"}
                continue
            t0 = time.time()
            seen = {kern: len(compiled_resources(kern)) for kern in (tiled._tiled_attention_kernel, _causal_kernel)}
            try:
                outs = [fn(*st) for st in staged]
                per_chunk = [median_ms(lambda: fn(*st), dev, warmup=2, reps=args.reps) for st in staged]  # noqa: B023
            except Exception as exc:
                entry["runs"][name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
                print(f"L={length:6d} {name:30s} {entry['runs'][name]['error']}", flush=True)
                continue
            if name.startswith("canon_"):
                outputs[name] = outs
            total = sum(per_chunk)
            err = float((torch.cat(outs).float() - reference).abs().max())
            binaries = [b for kern, n in seen.items() for b in compiled_resources(kern)[n:]]
            entry["runs"][name] = {"total_ms": round(total, 4), "TFLOPs": round(total_flops / total / 1e9, 1),
                                   "max_abs_diff_vs_fast_128x64x8x3": err, "wall_s": round(time.time() - t0, 1),
                                   "new_binaries": binaries}
            print(f"L={length:6d} {name:30s} {total:8.3f} ms {total_flops / total / 1e9:6.1f} TFLOP/s "
                  f"(max |diff| {err:.2e}; {time.time() - t0:.0f} s) "
                  f"{[(b.get('n_regs'), b.get('n_spills')) for b in binaries]}", flush=True)
        for name, outs in outputs.items():
            base = next(b for prefix, b in BITS_BASE.items() if name.startswith(prefix + "_"))
            if name != base and base in outputs:
                entry["bits"][f"{name} == {base}"] = all(torch.equal(a, b) for a, b in zip(outs, outputs[base]))
        print(f"L={length:6d} bits: {json.dumps(entry['bits'])}", flush=True)
        result["lengths"].append(entry)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    result["resources"] = {"engine_tiled_kernel": compiled_resources(tiled._tiled_attention_kernel),
                           "minimal_kernel": compiled_resources(_causal_kernel)}
    print(json.dumps(result["resources"]), flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
