"""How much the measured GEMM ceiling moves with the warm-up before it (the roofline of every benchmark divides by it).

    PYTHONPATH=src python3 benchmarks/device/ceiling_warmup.py --order short,long --out ceiling.json

In one fresh process: the 8192^3 bf16 product timed as ``measure_ceilings`` times it ("short": 3 warm-ups, median of
10) and after ~35 ms of products ("long": 25 warm-ups, median of 25), in ``--order``; run it in several processes to
see the spread between them (the round-21 calls saw 746-792 TFLOP/s with the short one). Round 21's call G: the long
one is the lower (666-702 against 739-785 first in a process): the H200 does not sustain its first milliseconds' rate
under back-to-back products, so the harness keeps the short one (the rate the issue's roofline names, ~790).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from llm42.bench.devicetime import median_ms  # noqa: E402

SETTINGS = {"short": (3, 10), "long": (25, 25)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--order", default="short,long")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dev, n = torch.device("cuda"), 8192
    gen = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(n, n, device=dev, generator=gen).to(torch.bfloat16)
    b = torch.randn(n, n, device=dev, generator=gen).to(torch.bfloat16)
    out = {}
    for name in args.order.split(","):
        warmup, reps = SETTINGS[name]
        ms = median_ms(lambda: a @ b, dev, warmup=warmup, reps=reps)
        out[name] = 2 * n ** 3 / ms / 1e9
        print(f"{name}: {out[name]:.0f} TFLOP/s", flush=True)
    with open(args.out, "a") as f:
        f.write(json.dumps({"order": args.order, "tflops": out}) + "\n")


if __name__ == "__main__":
    main()
