"""Which tiles the batch-invariant Triton matmul should pin per weight shape: a sweep against cuBLAS.

    PYTHONPATH=src python3 benchmarks/device/gemm_config_sweep.py --out sweep.json [--models 8b,smollm2]
        [--rows 256,2048] [--reps 20] [--candidates pointer|tma|all]

For every linear weight shape of the models (the 8B shape: qkv, o, gate_up, down; SmolLM2-135M's), bf16, random
data, and every candidate tile configuration (``CANDIDATES``: BLOCK_M/N/K, GROUP_M, stages, warps, programs per
SM), one matmul over M rows for each ``--rows`` value, timed with CUDA events (median of ``--reps`` after 3
warm-ups), beside ``F.linear`` (cuBLAS at that M) and cuBLAS on 256-row blocks (what the canonical pass's
default GEMM costs, ``GemmRowBlocks``). Each candidate's rows are also checked to be its own at any M (the
first 256 rows of the M-row product equal the 256-row product bit for bit): every candidate keeps the kernel's
contract. Per shape, ``best`` is the candidate with the least summed time over the ``--rows`` values, and
``pin`` the line for ``_SHAPE_CONFIGS`` in src/llm42/kernels/batch_invariant_matmul.py where it beats the
dtype's default by more than 3 %. A sweep that picks pinned tiles, run once on the device; not a benchmark of
the engine.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

from llm42.bench.devicetime import median_ms  # noqa: E402
import triton  # noqa: E402

from llm42.kernels.batch_invariant_matmul import _CONFIGS, config_for, matmul  # noqa: E402

CUDA = torch.device("cuda")

SHAPES = {  # (name, N, K) of each linear: out features x in features
    "8b": [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336),
           ("lm_head", 128256, 4096)],
    "smollm2": [("qkv", 960, 576), ("o", 576, 576), ("gate_up", 3072, 576), ("down", 576, 1536),
                ("lm_head", 49152, 576)],
}


def _c(bm, bn, bk, stages, warps, per_sm=1, group=8, tma=False):
    config = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group, num_stages=stages, num_warps=warps,
                  PROGRAMS_PER_SM=per_sm)
    if tma:
        config["TMA"] = True
    return config


CANDIDATES = [
    _c(128, 128, 64, 3, 8),  # the bf16 default
    _c(128, 256, 64, 3, 8),
    _c(128, 128, 64, 4, 4),
    _c(128, 128, 64, 4, 8),
    _c(128, 128, 64, 3, 4, per_sm=2),
    _c(128, 64, 64, 4, 4),
    _c(128, 64, 64, 4, 4, per_sm=2),
    _c(64, 128, 64, 4, 4),
    _c(64, 128, 64, 4, 4, per_sm=2),
    _c(64, 64, 64, 4, 4, per_sm=2),
    _c(64, 256, 64, 3, 8),
    _c(128, 256, 64, 4, 8),
]
# round 18: x and w read through TMA descriptors (``TMA``: the same tiles and K walk, bulk tensor copies instead of
# masked pointer loads; other bits than the pointer kernel's may result, a row's bits still its own at any M)
TMA_CANDIDATES = [
    _c(128, 256, 64, 3, 8, tma=True),
    _c(128, 256, 64, 4, 8, tma=True),
    _c(128, 128, 64, 3, 8, tma=True),
    _c(128, 128, 64, 4, 8, tma=True),
    _c(128, 128, 64, 5, 8, tma=True),
    _c(128, 128, 64, 4, 4, tma=True),
    _c(128, 128, 64, 4, 4, per_sm=2, tma=True),
    _c(128, 128, 128, 3, 8, tma=True),
    _c(256, 128, 64, 3, 8, tma=True),
    _c(64, 256, 64, 4, 4, tma=True),
    _c(64, 128, 64, 4, 4, tma=True),
    _c(64, 128, 64, 4, 4, per_sm=2, tma=True),
]
# round 18's second sweep (call C), around the first one's winners on the 8B shape: deeper pipelines, K = 128 steps,
# 256-row tiles, other L2 groupings
TMA2_CANDIDATES = [
    _c(128, 128, 128, 3, 8, tma=True),
    _c(128, 128, 64, 5, 8, tma=True),
    _c(128, 256, 64, 3, 8, tma=True),
    _c(128, 256, 128, 2, 8, tma=True),
    _c(256, 128, 64, 4, 8, tma=True),
    _c(128, 128, 64, 6, 8, tma=True),
    _c(128, 128, 64, 5, 8, group=16, tma=True),
    _c(128, 128, 128, 3, 8, group=4, tma=True),
    _c(128, 256, 64, 3, 8, group=16, tma=True),
    _c(128, 128, 64, 5, 4, tma=True),
    _c(64, 256, 64, 5, 4, tma=True),
    _c(128, 128, 128, 3, 8, per_sm=2, tma=True),
]


def device_ms(fn, reps: int) -> float:
    return median_ms(fn, CUDA, warmup=3, reps=reps)


def blocks(x, w, rows=256):
    return torch.cat([F.linear(x[i:i + rows], w) for i in range(0, x.shape[0], rows)])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="8b,smollm2")
    ap.add_argument("--rows", default="256,2048")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--candidates", choices=("pointer", "tma", "tma2", "all"), default="pointer",
                    help="pointer: the masked-load kernel's tiles (round 14's sweep); tma: the TMA kernel's and the "
                    "pinned tiles; tma2: round 18's second TMA sweep; all: pointer and tma")
    args = ap.parse_args()
    candidates = {"pointer": CANDIDATES, "tma": TMA_CANDIDATES, "tma2": TMA2_CANDIDATES,
                  "all": CANDIDATES + TMA_CANDIDATES}[args.candidates]
    torch.manual_seed(0)
    row_counts = [int(r) for r in args.rows.split(",")]
    default = dict(_CONFIGS[torch.bfloat16], PROGRAMS_PER_SM=1)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "rows": row_counts, "candidates": candidates, "shapes": []}
    for model in args.models.split(","):
        for name, n, k in SHAPES[model]:
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
            xs = {m: torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for m in row_counts}
            entry = {"model": model, "name": name, "N": n, "K": k, "cublas_ms": {}, "cublas_256_blocks_ms": {},
                     "pinned": config_for(torch.bfloat16, n, k), "candidates": []}
            shape_candidates = [default] + [c for c in candidates if c != default]
            pinned = dict(config_for(torch.bfloat16, n, k))
            pinned.setdefault("PROGRAMS_PER_SM", 1)
            if pinned not in shape_candidates:
                shape_candidates.append(pinned)
            for m, x in xs.items():
                entry["cublas_ms"][m] = round(device_ms(lambda: F.linear(x, w), args.reps), 4)  # noqa: B023
                entry["cublas_256_blocks_ms"][m] = round(device_ms(lambda: blocks(x, w), args.reps), 4)  # noqa: B023
            for config in shape_candidates:
                row = {"config": config, "is_pinned": config == pinned, "ms": {}}
                try:
                    for m, x in xs.items():
                        row["ms"][m] = round(device_ms(lambda: matmul(x, w, config=config), args.reps), 4)  # noqa: B023
                    big = xs[max(row_counts)]
                    row["rows_own_bits"] = bool(torch.equal(matmul(big, w, config=config)[:256],
                                                            matmul(big[:256].clone(), w, config=config)))
                except Exception as exc:  # a config Triton cannot build (shared memory): recorded, skipped
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                entry["candidates"].append(row)
            ok = [r for r in entry["candidates"] if "error" not in r and r.get("rows_own_bits")]
            best = min(ok, key=lambda r: sum(r["ms"].values()))
            base = next(r for r in entry["candidates"] if r["config"] == default)
            entry["best"] = best
            entry["best_over_default"] = round(sum(best["ms"].values()) / sum(base["ms"].values()), 4)
            entry["best_over_cublas_256_blocks"] = {m: round(best["ms"][m] / entry["cublas_256_blocks_ms"][m], 4)
                                                    for m in row_counts}
            if entry["best_over_default"] < 0.97:
                entry["pin"] = f"(torch.bfloat16, {n}, {k}): {best['config']},"
            result["shapes"].append(entry)
            pin_row = next(r for r in entry["candidates"] if r["is_pinned"])
            entry["best_over_pinned"] = (round(sum(best["ms"].values()) / sum(pin_row["ms"].values()), 4)
                                         if "error" not in pin_row else None)
            entry["best_over_cublas"] = {m: round(best["ms"][m] / entry["cublas_ms"][m], 4) for m in row_counts}
            cublas = " ".join(f"{m}:{entry['cublas_ms'][m]:.3f}/{entry['cublas_256_blocks_ms'][m]:.3f}"
                              for m in row_counts)
            print(f"{model:8s} {name:8s} N={n:6d} K={k:6d}  cuBLAS {cublas}" +
                  "  default " + " ".join(f"{base['ms'][m]:.3f}" for m in row_counts) +
                  "  pinned " + " ".join(f"{pin_row['ms'].get(m, float('nan')):.3f}" for m in row_counts) +
                  "  best " + " ".join(f"{best['ms'][m]:.3f}" for m in row_counts) +
                  f"  {best['config']}", flush=True)
            Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
