"""The canonical Triton GEMM's scheduling options on the 8B shape's pinned TMA tiles: time and bits.

    PYTHONPATH=src python3 benchmarks/device/gemm_schedule.py --out gemm_schedule.json [--rows 2048]
        [--reps 20] [--timeout-s 75] [--groups pinned,flatten,...] [--shapes qkv,o,gate_up,down,lm_head]

For each of the Llama-3.1-8B shape's four layer weights (bf16, random, the same seeds in every process): the
pinned TMA config as it is, and with the kernel's scheduling options (``FLATTEN``: the tile and K loops pipelined
as one; ``STORE``: the epilogue through a TMA descriptor, whole or in two halves), and other tiles with them;
device ms per call (CUDA events, median of ``--reps``), TFLOP/s, one cuBLAS call (``F.linear``) beside them, and
whether every output has the pinned launch's bits (SHA-256 of the output's bytes, compared across processes).

Each group of variants runs in a process of its own under ``--timeout-s`` (a compile or launch that never
finishes costs that group only, and says so), printing one JSON line per measurement as it goes; the parent
collects the lines, compares digests and writes ``--out``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

from llm42.kernels.batch_invariant_matmul import _tiles  # noqa: E402  (the library's config builder)

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
          "lm_head": (128256, 4096)}  # (N, K)


def _whole(bm, bn, stages, warps, per_sm=1, **options):
    """A whole TMA config (not options over the pinned one)."""
    return {**_tiles(bm, bn, stages, warps, per_sm, tma=True, **options), "whole": True}


def _flat(bm, bn, stages, warps, per_sm=1):
    return (f"flat_{bm}x{bn}_s{stages}_w{warps}" + (f"_p{per_sm}" if per_sm > 1 else ""),
            _whole(bm, bn, stages, warps, per_sm, flatten=True))


# round 18's pins of the 8B shape (the bits every round since commits): the reference the schedules must match
ROUND18 = {(n, k): _tiles(bm, bn, stages, warps, tma=True) for (n, k), (bm, bn, stages, warps) in {
    (6144, 4096): (128, 128, 5, 4), (4096, 4096): (128, 128, 5, 8), (28672, 4096): (128, 256, 3, 8),
    (4096, 14336): (128, 128, 6, 8), (128256, 4096): (128, 256, 3, 8)}.items()}

# group -> [(variant name, options over the pinned config, or a whole config)]
GROUPS = {
    "pinned": [("pinned", {})],
    "round18": [("round18", {"round18": True})],
    "flatten": [("flatten", {"FLATTEN": True})],
    "store": [("tma_store", {"STORE": "tma"}), ("tma_halves", {"STORE": "tma_halves"})],
    "flatten_store": [("flatten_tma", {"FLATTEN": True, "STORE": "tma"}),
                      ("flatten_halves", {"FLATTEN": True, "STORE": "tma_halves"})],
    "tiles_flat": [(f"flat_halves_{bm}x{bn}_s{s}_w{w}", _whole(bm, bn, s, w, flatten=True, store="tma_halves"))
                   for bm, bn, s, w in ((128, 256, 3, 8), (128, 128, 4, 8), (128, 128, 4, 4), (256, 128, 3, 8))],
    "tiles_plain": [(f"plain_{bm}x{bn}_s{s}_w{w}", _whole(bm, bn, s, w))
                    for bm, bn, s, w in ((128, 256, 3, 8), (128, 128, 4, 8))],
    # round 21's second sweep: narrower tiles and two programs per SM for the GEMMs whose tiles fill few waves
    "tiles_narrow": [_flat(128, 128, 3, 4, 2), _flat(128, 64, 4, 4), _flat(64, 128, 4, 4), _flat(128, 64, 3, 4, 2),
                     _flat(64, 128, 3, 4, 2), _flat(64, 256, 3, 8)],
    "tiles_wide": [_flat(128, 256, 3, 8), _flat(128, 256, 4, 8), _flat(256, 128, 3, 8), _flat(128, 128, 5, 4),
                   _flat(128, 128, 6, 8)],
}


def child(group: str, shapes: list[str], rows_list: list[int], reps: int) -> None:
    from llm42.bench.devicetime import median_ms
    from llm42.kernels.batch_invariant_matmul import config_for, matmul

    dev, dtype = torch.device("cuda"), torch.bfloat16
    for n, k in (SHAPES[name] for name in shapes):
        gen = torch.Generator(device=dev).manual_seed(n * 7 + k)
        w = (torch.randn(n, k, device=dev, generator=gen) / k ** 0.5).to(dtype)
        for rows in rows_list:
            x = torch.randn(rows, k, device=dev, generator=gen).to(dtype)
            flop = 2.0 * rows * n * k
            if group == "pinned":
                ms = median_ms(lambda: torch.nn.functional.linear(x, w), dev, warmup=3, reps=reps)  # noqa: B023
                print(json.dumps({"n": n, "k": k, "rows": rows, "variant": "cublas", "ms": ms,
                                  "tflops": flop / ms / 1e9}), flush=True)
            for name, opts in GROUPS[group]:
                opts = dict(opts)
                if opts.pop("round18", False):
                    config = ROUND18[(n, k)]
                elif opts.pop("whole", False):
                    config = opts
                else:
                    config = {**config_for(dtype, n, k), **opts}
                out = matmul(x, w, config=config)
                torch.cuda.synchronize()
                digest = hashlib.sha256(out.view(torch.int16).cpu().numpy().tobytes()).hexdigest()[:16]
                ms = median_ms(lambda: matmul(x, w, config=config), dev, warmup=3, reps=reps)  # noqa: B023
                print(json.dumps({"n": n, "k": k, "rows": rows, "variant": name, "ms": ms, "tflops": flop / ms / 1e9,
                                  "digest": digest, "config": config}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--rows", default="2048")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--timeout-s", type=float, default=75.0)
    ap.add_argument("--groups", default="pinned,flatten,store,flatten_store,tiles_flat,tiles_plain")
    ap.add_argument("--shapes", default="qkv,o,gate_up,down")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    rows_list = [int(r) for r in args.rows.split(",")]
    if args.child:
        child(args.child, args.shapes.split(","), rows_list, args.reps)
        return
    lines, status = [], {}
    for group in args.groups.split(","):
        cmd = [sys.executable, __file__, "--child", group, "--shapes", args.shapes, "--rows", args.rows,
               "--reps", str(args.reps)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout_s)
            stdout, status[group] = done.stdout, f"exit {done.returncode}"
            if done.returncode:
                status[group] += ": " + done.stderr.strip().splitlines()[-1][:300] if done.stderr.strip() else ""
        except subprocess.TimeoutExpired as exc:
            stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            status[group] = f"timed out after {args.timeout_s:.0f} s"
        got = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
        lines += got
        print(f"[gemm_schedule] group {group}: {status[group]}, {len(got)} measurements", flush=True)
    pinned = {(r["n"], r["k"], r["rows"]): r for r in lines if r["variant"] == "pinned"}
    cublas = {(r["n"], r["k"], r["rows"]): r for r in lines if r["variant"] == "cublas"}
    for r in lines:
        key = (r["n"], r["k"], r["rows"])
        if "digest" in r and key in pinned:
            r["same_bits_as_pinned"] = r["digest"] == pinned[key]["digest"]
        if key in cublas:
            r["x_cublas_time"] = r["ms"] / cublas[key]["ms"]
        print(f"{r['n']}x{r['k']} rows {r['rows']} {r['variant']:<28} {r['ms']:.3f} ms {r['tflops']:6.0f} TFLOP/s"
              f"  {r.get('x_cublas_time', float('nan')):.3f}x cuBLAS"
              f"{'' if r.get('same_bits_as_pinned', True) else '  OTHER BITS'}", flush=True)
    totals = {}
    for r in lines:
        totals.setdefault(r["variant"], []).append(r["ms"])
    summary = {v: sum(ms) for v, ms in totals.items() if len(ms) == len(args.shapes.split(",")) * len(rows_list)}
    for v, ms in sorted(summary.items(), key=lambda kv: kv[1]):
        print(f"sum over shapes {v:<28} {ms:.3f} ms", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name() if torch.cuda.is_available()
                                              else None, "torch": torch.__version__, "status": status,
                                              "measurements": lines, "sum_ms": summary}, indent=1) + "\n")


if __name__ == "__main__":
    main()
