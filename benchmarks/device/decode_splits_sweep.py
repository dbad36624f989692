"""The fast decode attention kernel's time by KV split count, at serving-like contexts (CUDA).

    PYTHONPATH=src python3 benchmarks/device/decode_splits_sweep.py OUT.json [--reps 30]

For two head shapes (SmolLM2-135M: 9 query / 3 kv heads of 64; Llama-3.1-8B: 32 / 8 of 128), batch sizes
16 ... 1,024 and two context sets (uniform in [200, 1,300]: a ShareGPT-like decode batch; and every
sequence at 4,096), ``paged_decode_attention`` (one layer, bf16, pages of 16 in shuffled block tables) is
timed with CUDA events (median of ``--reps`` replays of a graph of 10 launches: no host launch cost, as
in the engine's decode graphs) at every split count, against the K/V bytes it must read at
the measured copy bandwidth. ``current`` is the split count ``choose_num_splits`` gives inside a
decode graph (its bound is the model's context, 4,096). A diagnostic for the split heuristic (issue 10).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from llm42.bench import devicetime  # noqa: E402
from llm42.kernels import attention  # noqa: E402

SHAPES = {"smollm2": (9, 3, 64), "8b": (32, 8, 128)}
PAGE = 16
LAUNCHES = 10
CONFIGS = ((32, 2, 3), (32, 4, 3), (64, 2, 3), (128, 4, 2), (128, 8, 2))  # (key block, warps, stages)
SPLITS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)


def copy_gbps() -> float:
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    ms = devicetime.median_ms(lambda: y.copy_(x), torch.device("cuda"), warmup=3, reps=10)
    return 2 * x.numel() / (ms * 1e-3) / 1e9


def graph_ms(fn, reps: int) -> float:
    """Device milliseconds of one ``fn()``: ``LAUNCHES`` calls captured in one CUDA graph (no host launch cost,
    as inside the engine's decode graphs), the graph's replay timed with CUDA events, median of ``reps``."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # Triton compiles outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(LAUNCHES):
            fn()
    ms = devicetime.median_ms(graph.replay, torch.device("cuda"), warmup=2, reps=reps) / LAUNCHES
    del graph
    return ms


def case(shape: str, batch: int, contexts: list[int], reps: int, gbps: float, with_configs: bool) -> dict:
    num_heads, num_kv_heads, head_dim = SHAPES[shape]
    gen = torch.Generator().manual_seed(batch)
    blocks_per = [-(-c // PAGE) for c in contexts]
    total_blocks = sum(blocks_per) + 1
    dev, dtype = "cuda", torch.bfloat16
    torch.manual_seed(batch)
    k = torch.randn(total_blocks * PAGE, num_kv_heads, head_dim, device=dev, dtype=dtype)
    v = torch.randn(total_blocks * PAGE, num_kv_heads, head_dim, device=dev, dtype=dtype)
    perm = torch.randperm(total_blocks - 1, generator=gen)
    max_blocks = 4096 // PAGE
    tables = torch.full((batch, max_blocks), total_blocks - 1, dtype=torch.int64)
    at = 0
    for b, n in enumerate(blocks_per):
        tables[b, :n] = perm[at: at + n]
        at += n
    tables = tables.to(dev)
    ctx = torch.tensor(contexts, dtype=torch.int64, device=dev)
    q = torch.randn(batch, num_heads, head_dim, generator=gen).to(dev, dtype)
    scale = head_dim ** -0.5
    kv_bytes = 2 * sum(contexts) * num_kv_heads * head_dim * 2
    floor_ms = kv_bytes / (gbps * 1e9) * 1e3
    times = {}
    for s in SPLITS:
        times[s] = graph_ms(lambda s=s: attention.paged_decode_attention(q, k, v, tables, ctx, block_size=PAGE,
                                                                         scale=scale, num_splits=s), reps)
    configs = {}
    if with_configs:  # other launch configurations (key block, warps, stages) at a few split counts
        saved = attention.DECODE_BLOCK_N, attention.DECODE_WARPS, attention.DECODE_STAGES
        try:
            for cfg in CONFIGS:
                attention.DECODE_BLOCK_N, attention.DECODE_WARPS, attention.DECODE_STAGES = cfg
                for s in (1, 4, 8, 16):
                    configs[f"{cfg[0]}x{cfg[1]}x{cfg[2]}/{s}"] = round(graph_ms(
                        lambda s=s: attention.paged_decode_attention(q, k, v, tables, ctx, block_size=PAGE,
                                                                     scale=scale, num_splits=s), reps), 4)
        finally:
            attention.DECODE_BLOCK_N, attention.DECODE_WARPS, attention.DECODE_STAGES = saved
    current = attention.choose_num_splits(batch, num_kv_heads, 4096, num_sms=attention.num_sms(q.device),
                                          block_n=attention.DECODE_BLOCK_N)
    best = min(times, key=times.get)
    return {"shape": shape, "batch": batch, "mean_context": sum(contexts) / batch, "kv_floor_ms": round(floor_ms, 4),
            "ms_by_splits": {str(s): round(t, 4) for s, t in times.items()},
            "current_splits": current, "current_ms": round(times[current], 4) if current in times else None,
            "best_splits": best, "best_ms": round(times[best], 4),
            "current_over_best": round(times[current] / times[best], 3) if current in times else None,
            "ms_by_config_and_splits": configs}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--batches", default="16,32,64,96,144,256,512,1024")
    args = ap.parse_args()
    gbps = copy_gbps()
    result = {"device": torch.cuda.get_device_name(), "copy_GBps": round(gbps, 1), "cases": []}
    for shape in SHAPES:
        for batch in (int(b) for b in args.batches.split(",")):
            gen = torch.Generator().manual_seed(7 * batch)
            for label, contexts in (("sharegpt", torch.randint(200, 1301, (batch,), generator=gen).tolist()),
                                    ("4096", [4096] * batch)):
                if label == "4096" and shape == "8b" and batch > 256:
                    continue
                row = case(shape, batch, contexts, args.reps, gbps, label == "sharegpt" and batch in (64, 96, 256))
                row["contexts"] = label
                result["cases"].append(row)
                print(json.dumps(row), flush=True)
                Path(args.out).write_text(json.dumps(result, indent=1))
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
