"""The canonical Triton GEMM's pinned TMA tiles with Triton's loop options: flattening the tile and K loops into one
pipeline, and warp specialisation; time and bits against the pinned launch and cuBLAS.

    PYTHONPATH=src python3 benchmarks/device/gemm_loop_options.py --out gemm_loops.json [--rows 2048,256] [--reps 20]

For each of the Llama-3.1-8B shape's four layer weights (bf16, random): the pinned config as it is, with
``FLATTEN``, with ``WARP_SPECIALIZE``, with both; device ms (CUDA events, median), whether every output has the pinned
launch's bits, and one cuBLAS call (``F.linear``) beside them. A failed compile is recorded, not fatal.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

from llm42.bench.devicetime import median_ms  # noqa: E402
from llm42.kernels.batch_invariant_matmul import config_for, matmul  # noqa: E402

SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]
OPTIONS = {"pinned": {}, "flatten": {"FLATTEN": True}, "warp_specialize": {"WARP_SPECIALIZE": True},
           "both": {"FLATTEN": True, "WARP_SPECIALIZE": True}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", default="2048,256")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    dev, dtype = torch.device("cuda"), torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(0)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "shapes": []}
    for n, k in SHAPES:
        w = (torch.randn(n, k, device=dev, generator=gen) * 0.02).to(dtype)
        for rows in (int(r) for r in args.rows.split(",")):
            x = torch.randn(rows, k, device=dev, generator=gen).to(dtype)
            entry = {"n": n, "k": k, "rows": rows, "pinned": config_for(dtype, n, k), "runs": {}}
            base = matmul(x, w)
            entry["runs"]["cublas"] = {"ms": round(median_ms(lambda: torch.nn.functional.linear(x, w), dev,  # noqa: B023
                                                             warmup=3, reps=args.reps), 4)}
            for name, extra in OPTIONS.items():
                config = {**config_for(dtype, n, k), **extra}
                try:
                    out = matmul(x, w, config=config)
                    ms = median_ms(lambda: matmul(x, w, config=config), dev, warmup=3, reps=args.reps)  # noqa: B023
                except Exception as exc:  # an option this Triton does not take on this GPU
                    entry["runs"][name] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
                    print(f"{n}x{k} rows {rows} {name}: {entry['runs'][name]['error']}", flush=True)
                    continue
                entry["runs"][name] = {"ms": round(ms, 4), "same_bits_as_pinned": bool(torch.equal(out, base))}
            line = "  ".join(f"{name} {r.get('ms', 'err')}{'' if r.get('same_bits_as_pinned', True) else ' (other bits)'}"
                             for name, r in entry["runs"].items())
            print(f"{n}x{k} rows {rows}: {line}", flush=True)
            result["shapes"].append(entry)
            Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
