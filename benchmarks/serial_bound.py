"""The roofline and serial bounds of the serving benchmark's offline set at a device's measured ceilings, no device.

    .venv/bin/python benchmarks/serial_bound.py --ceilings benchmarks/results/h100_round46/call_s8b/steady_8b.json \
        --max-num-seqs 1024 --out bound_8b_h100.json

``--ceilings``: a ``benchmarks/serving.py`` JSON; its ``ceilings`` (the copy bandwidth and the GEMM rate that run
measured on its device) price the set. The set is ``benchmarks/serving.py``'s offline one (1,000 ShareGPT-like
requests, seed 0) on the 8B shape; the weights are meta tensors (shapes only). ``llm42.bench.roofline`` gives
both bounds: ``bound_s`` (decode's GEMMs and reads overlapped) and ``serial_bound_s`` (a step's GEMMs, then its
K/V reads, as llm42's step runs them), and the terms of each.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from llm42.bench.models import llama31_8b_shape  # noqa: E402
from llm42.bench.roofline import roofline  # noqa: E402
from llm42.bench.workloads import sharegpt_like  # noqa: E402
from llm42.model.weights import assemble, meta_tensors  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ceilings", required=True, help="a benchmarks/serving.py JSON holding 'ceilings'")
    ap.add_argument("--num-requests", type=int, default=1000)
    ap.add_argument("--max-num-seqs", type=int, default=1024)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    measured = json.loads(Path(args.ceilings).read_text())
    ceilings = measured["ceilings"]
    cfg = llama31_8b_shape(4096)
    weights = assemble(cfg, meta_tensors(cfg, torch.bfloat16))
    workload = sharegpt_like(args.num_requests, vocab_size=cfg.vocab_size, seed=0, length_scale=1.0)
    bound = roofline(workload, weights, cfg, copy_GBps=ceilings["copy_GBps"],
                     matmul_TFLOPs=ceilings["matmul_TFLOPs"], max_num_seqs=args.max_num_seqs)
    out = {"command": " ".join(sys.argv), "ceilings_from": args.ceilings,
           "device": (measured.get("meta") or {}).get("device"), "max_num_seqs": args.max_num_seqs, **bound}
    Path(args.out).write_text(json.dumps(out, indent=1))
    terms = ("prefill_s", "decode_compute_s", "decode_memory_s", "decode_kv_s", "bound_s", "serial_bound_s")
    print(json.dumps({k: round(out[k], 2) for k in terms}))
    print(f"output tokens {out['output_tokens']:,}: roofline {out['output_tokens_per_s']:,.0f} tok/s, serial "
          f"{out['serial_output_tokens_per_s']:,.0f} tok/s ({ceilings['matmul_TFLOPs']:.0f} TFLOP/s, "
          f"{ceilings['copy_GBps']:.0f} GB/s)")


if __name__ == "__main__":
    main()
