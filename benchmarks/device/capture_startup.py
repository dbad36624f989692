"""What ``llm42 serve`` spends at start-up capturing every CUDA graph (``DVRGenerator.capture_graphs``), round 40.

    PYTHONPATH=src python3 benchmarks/device/capture_startup.py --out capture_startup.json [--models smollm2,8b]

Per model shape (random bf16 weights; SmolLM2-135M's shape and Llama-3.1-8B's), a generator with ``llm42 serve``'s
defaults (256 seats, 512 fast tokens, window 32 x group 8): the graphs captured per kind, the seconds
``capture_graphs()`` took (wall, device drained after; the first model in a process also compiles the Triton kernels),
the device memory it added (allocated and reserved, after the allocator's cache is emptied; the K/V store's excluded:
it exists before), and a second call (nothing left to capture: zero graphs). A start-up cost,
not a benchmark of the engine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from profile_serving import smollm2_shape  # noqa: E402

from llm42 import DVRGenerator  # noqa: E402
from llm42.model.config import llama31_8b_config  # noqa: E402
from llm42.model.weights import random_weights  # noqa: E402


def measure(name: str) -> dict:
    cfg = smollm2_shape() if name == "smollm2" else llama31_8b_config(max_position_embeddings=4096)
    weights = random_weights(cfg, seed=0, dtype=torch.bfloat16, device="cuda")
    gen = DVRGenerator(weights, cfg, max_num_seqs=256, max_fast_tokens=512,
                       kv_cache_tokens=256 * 1024 if name == "smollm2" else 64 * 1024)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # the memory an earlier model's generator left cached: not this one's graphs
    before = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    start = time.perf_counter()
    counts = gen.capture_graphs()
    seconds = time.perf_counter() - start
    after = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    again = gen.capture_graphs()
    gen.close()
    return {"counts": counts, "graphs": sum(counts.values()), "seconds": round(seconds, 2),
            "added_allocated_gib": round((after[0] - before[0]) / 2**30, 3),
            "added_reserved_gib": round((after[1] - before[1]) / 2**30, 3), "second_call": again}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="smollm2,8b")
    args = ap.parse_args()
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "models": {}}
    for name in args.models.split(","):
        out["models"][name] = measure(name)
        print(name, out["models"][name], flush=True)
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
