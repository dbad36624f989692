"""RoPE + K/V store: the row-program launch against the (row, head) launch, one process, CUDA events, medians.

    PYTHONPATH=src python3 benchmarks/device/rope_bench.py --out rope.json

Shapes: the 8B (32 / 8 heads x 128) and SmolLM2 (9 / 3 x 64) at 1, 64, 256 and 2,048 rows, bf16; the q and K/V
outputs of the two launches are compared bit for bit, and each launch's time is set against the bytes it moves.
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
from llm42.kernels import fused  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    rows_out = []
    for name, hq, hkv, d in (("8b", 32, 8, 128), ("smollm2", 9, 3, 64)):
        for rows in (1, 64, 256, 2048):
            gen = torch.Generator(device="cuda").manual_seed(rows)
            qkv = torch.randn(rows, (hq + 2 * hkv) * d, device="cuda", generator=gen).bfloat16()
            q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
            q, k, v = q.view(rows, hq, d), k.view(rows, hkv, d), v.view(rows, hkv, d)
            cos = torch.randn(rows, d, device="cuda", generator=gen).bfloat16()
            sin = torch.randn(rows, d, device="cuda", generator=gen).bfloat16()
            slots = torch.randperm(4 * rows, device="cuda", generator=gen)[:rows]
            outs = {}
            entry = {"shape": name, "rows": rows}
            for label, flag in (("per_head", False), ("rows", True)):
                fused.ROPE_ROW_PROGRAMS = flag
                kc = torch.zeros(4 * rows, hkv, d, device="cuda", dtype=torch.bfloat16)
                vc = torch.zeros_like(kc)
                call = lambda: fused.rope_and_store(q, k, v, cos, sin, kc, vc, slots)  # noqa: E731
                outs[label] = (call(), kc.clone(), vc.clone())
                entry[f"{label}_ms"] = median_ms(call, torch.device("cuda"), warmup=5, reps=50)
            fused.ROPE_ROW_PROGRAMS = True
            moved = 2 * (2 * rows * (hq + 2 * hkv) * d) + 2 * rows * 2 * d  # read q/k/v + write, cos/sin
            entry["bytes"] = moved
            entry["rows_GBps"] = moved / entry["rows_ms"] / 1e6
            entry["per_head_GBps"] = moved / entry["per_head_ms"] / 1e6
            entry["same_bits"] = all(torch.equal(a, b) for a, b in zip(outs["per_head"], outs["rows"]))
            rows_out.append(entry)
            print(json.dumps(entry), flush=True)
    args.out.write_text(json.dumps(rows_out, indent=1) + "\n")
    return 0 if all(e["same_bits"] for e in rows_out) else 1


if __name__ == "__main__":
    sys.exit(main())
