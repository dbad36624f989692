"""The fast path's GEMMs: cuBLAS (``F.linear``) against ``torch.compile``'s max-autotune choice, shape by shape.

    PYTHONPATH=src python3 benchmarks/device/fast_gemm_ab.py --out fast_gemm_ab.json [--models smollm2,8b]
        [--rows 16,64,128,256,512,1024,2048] [--reps 20] [--budget-s 300] [--cublas-only]

Issue 10 asks for torch.compile on the hot paths. Every fast-path step on CUDA is already a captured graph whose
row ops, attention and sampler are fused Triton kernels, so what inductor could still change is the GEMMs: its
max-autotune mode benchmarks its Triton matmul templates against the library call for each shape and keeps the
fastest. This script asks whether that pays, per linear of each model shape (qkv, o, gate_up, down, head) and per
row count M (the fast path's batch buckets):

- ``cublas``: ``F.linear(x, w)``, what ``FastPolicy`` runs;
- ``compiled``: ``torch.compile(F.linear, mode="max-autotune-no-cudagraphs", dynamic=False)`` on that shape (one
  compile per shape; its seconds are reported), and which kernel it picked (the profiler's kernel names of one
  call: a Triton template or the library's GEMM).

Timed: each variant's call 10 times over inside one captured CUDA graph, replayed ``--reps`` times between CUDA
events (ms per call, medians); the two variants interleaved rep by rep. Each compiled output is compared with
cuBLAS's (max abs difference; they may differ in rounding, this is the fast path). Random bf16 data. A
benchmark, not a test. ``--cublas-only`` (round 52) times cuBLAS alone and names the kernel it picked, on a fine grid
of M: whether a decode batch's GEMMs cost what its rows need or what M rounded up to a tile needs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

from llm42.model.config import llama31_8b_config  # noqa: E402

CALLS_PER_GRAPH = 10


def smollm2_dims() -> dict:
    return {"hidden": 576, "q": 9 * 64, "kv": 3 * 64, "inter": 1536, "vocab": 49152}


def llama8b_dims() -> dict:
    cfg = llama31_8b_config(max_position_embeddings=4096)
    return {"hidden": cfg.hidden_size, "q": cfg.q_size, "kv": cfg.kv_size, "inter": cfg.intermediate_size,
            "vocab": cfg.vocab_size}


def linears(dims: dict) -> dict[str, tuple[int, int]]:
    """(N, K) of each linear: weight [N, K], x [M, K]."""
    h = dims["hidden"]
    return {"qkv": (dims["q"] + 2 * dims["kv"], h), "o": (h, dims["q"]), "gate_up": (2 * dims["inter"], h),
            "down": (h, dims["inter"]), "head": (dims["vocab"], h)}


def graphed(fn, *args):
    """``fn(*args)`` CALLS_PER_GRAPH times in one captured graph (warmed up on a side stream first)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn(*args)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = None
        for _ in range(CALLS_PER_GRAPH):
            out = fn(*args)
    return graph, out


def replay_ms(graph) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / CALLS_PER_GRAPH


def kernel_names(fn, *args) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    fn(*args)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(*args)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sorted(set(names))


def cublas_row(model: str, lname: str, m: int, n: int, k: int, plain, x, w, reps: int) -> dict:
    """``--cublas-only``: cuBLAS's time at this M and the kernel it picked (its tile shape is in the name)."""
    graph, _ = graphed(plain, x, w)
    ms = statistics.median(replay_ms(graph) for _ in range(reps))
    row = {"model": model, "linear": lname, "M": m, "N": n, "K": k, "cublas_ms": round(ms, 5),
           "cublas_tflops": round(2 * m * n * k / ms / 1e9, 1), "cublas_kernels": kernel_names(plain, x, w)}
    gemms = [name for name in row["cublas_kernels"] if not name.startswith("Memset")]  # a workspace's memset too
    print(f"{model:8s} {lname:8s} M={m:5d} N={n:6d} K={k:6d}  cublas {ms:.4f} ms ({row['cublas_tflops']:.0f} TF/s) "
          f"{gemms[0][:90] if gemms else ''}", flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="smollm2,8b")
    ap.add_argument("--rows", default="16,64,128,256,512,1024,2048")
    ap.add_argument("--linears", default="qkv,o,gate_up,down,head")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--budget-s", type=float, default=300.0, help="stop starting new shapes after this many seconds")
    ap.add_argument("--cublas-only", action="store_true",
                    help="time cuBLAS alone (no compile) and name its kernel: how its time steps with M")
    args = ap.parse_args()
    import torch._dynamo
    import torch._inductor.config as inductor_config

    # one compiled specialisation per shape: far more shapes than dynamo's default recompile limit
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 4096)
    start = time.perf_counter()
    dev = torch.device("cuda")
    report = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
              "inductor_max_autotune_gemm_backends": getattr(inductor_config, "max_autotune_gemm_backends", None),
              "calls_per_graph": CALLS_PER_GRAPH, "reps": args.reps, "shapes": [], "is_complete": False}
    out_path = Path(args.out)
    torch.manual_seed(0)
    wanted = set(args.linears.split(","))
    weights: dict = {}
    # the row counts are the outer loop, so a budget cut keeps every linear of the first (most important) rows
    plan = [(m, model, lname, nk) for m in (int(r) for r in args.rows.split(","))
            for model in args.models.split(",")
            for lname, nk in linears(smollm2_dims() if model == "smollm2" else llama8b_dims()).items()
            if lname in wanted]
    cut = False
    for m, model, lname, (n, k) in plan:
        if time.perf_counter() - start > args.budget_s:
            print(f"budget reached before {model} {lname} M={m}", flush=True)
            cut = True
            break
        if (model, lname) not in weights:
            weights[(model, lname)] = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * k ** -0.5
        w = weights[(model, lname)]
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)

        def plain(x, w):
            return F.linear(x, w)

        if args.cublas_only:
            report["shapes"].append(cublas_row(model, lname, m, n, k, plain, x, w, args.reps))
            out_path.write_text(json.dumps(report, indent=1))
            continue
        compiled = torch.compile(plain, mode="max-autotune-no-cudagraphs", dynamic=False)
        t = time.perf_counter()
        ref = plain(x, w)
        got = compiled(x, w)
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - t
        names = kernel_names(compiled, x, w)
        g_plain, _ = graphed(plain, x, w)
        g_comp, _ = graphed(compiled, x, w)
        times = {"cublas": [], "compiled": []}
        for _ in range(args.reps):
            times["cublas"].append(replay_ms(g_plain))
            times["compiled"].append(replay_ms(g_comp))
        med = {key: statistics.median(v) for key, v in times.items()}
        flops = 2 * m * n * k
        row = {"model": model, "linear": lname, "M": m, "N": n, "K": k,
               "cublas_ms": round(med["cublas"], 5), "compiled_ms": round(med["compiled"], 5),
               "compiled_over_cublas": round(med["compiled"] / med["cublas"], 4),
               "cublas_tflops": round(flops / med["cublas"] / 1e9, 1),
               "compiled_tflops": round(flops / med["compiled"] / 1e9, 1),
               "compile_s": round(compile_s, 2), "compiled_kernels": names,
               "compiled_picked_triton": any("triton" in s.lower() for s in names),
               "max_abs_diff": float((got.float() - ref.float()).abs().max())}
        report["shapes"].append(row)
        print(f"{model:8s} {lname:8s} M={m:5d} N={n:6d} K={k:6d}  cublas {row['cublas_ms']:.4f} ms "
              f"({row['cublas_tflops']:.0f} TF/s)  compiled {row['compiled_ms']:.4f} ms "
              f"({row['compiled_over_cublas']:.3f}x, {'triton' if row['compiled_picked_triton'] else 'lib'}) "
              f"compile {compile_s:.1f} s", flush=True)
        del g_plain, g_comp
        out_path.write_text(json.dumps(report, indent=1))
    report["is_complete"] = not cut
    report["elapsed_s"] = round(time.perf_counter() - start, 1)
    out_path.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
