"""Can a canonical pass run on a share of the SMs? A probe of CUDA green contexts through torch on this device.

    PYTHONPATH=src python3 benchmarks/device/green_probe.py --out green.json [--sms 16,32,66]

Prints and records, each step guarded so one failure does not hide the rest:
- the torch API (``torch.cuda.green_contexts``) and whether a green context gives a stream of its own;
- how many SMs a kernel launched on that stream reaches (a Triton kernel that records ``%smid`` per program), eagerly
  and replayed from a CUDA graph captured on it, and from the same graph replayed on an ordinary stream; and a graph
  captured on an ordinary stream replayed on the green one (round 42);
- whether cuBLAS and the batch-invariant Triton matmul give the same bits on it as on an ordinary stream;
- a contention test: a decode-like workload (many small GEMMs) timed alone, beside a wide GEMM workload on an
  ordinary stream, and beside the same workload on a green stream of each ``--sms`` size.
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import sys
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))


@triton.jit
def _smid_kernel(out_ptr, SPIN: tl.constexpr):
    sm = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
    acc = sm
    for _ in range(SPIN):  # keep the program resident a while, so programs spread over the SMs they may use
        acc = (acc * 1103515245 + 12345) & 0xFFFF
    tl.store(out_ptr + tl.program_id(0), sm + (acc & 0))


def sms_reached(out: torch.Tensor) -> int:
    return int(torch.unique(out).numel())


def launch_smid(out: torch.Tensor) -> None:
    _smid_kernel[(out.numel(),)](out, SPIN=20000)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--sms", default="16,32,66")
    args = ap.parse_args()
    res: dict = {"torch": torch.__version__, "triton": triton.__version__, "device": torch.cuda.get_device_name(),
                 "num_sms": torch.cuda.get_device_properties(0).multi_processor_count}

    def step(name, fn):
        try:
            res[name] = fn()
        except Exception as exc:
            res[name] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-1500:]}
        print(name, "->", json.dumps(res[name])[:600], flush=True)
        Path(args.out).write_text(json.dumps(res, indent=1, default=str) + "\n")

    from torch.cuda import green_contexts as gc

    step("api", lambda: {"supported": getattr(gc, "SUPPORTED", None),
                         "members": [m for m in dir(gc.GreenContext) if not m.startswith("__")],
                         "create": str(inspect.signature(gc.GreenContext.create))})
    sizes = [int(s) for s in args.sms.split(",")]
    greens = {}

    def make(n):
        try:
            g = gc.GreenContext.create(num_sms=n)
        except TypeError:
            g = gc.GreenContext.create(n)
        greens[n] = g
        return {"ok": True, "has_stream": hasattr(g, "Stream")}

    for n in sizes:
        step(f"create_{n}", lambda n=n: make(n))

    out = torch.zeros(4096, dtype=torch.int32, device="cuda")
    launch_smid(out)
    torch.cuda.synchronize()
    step("smid_ordinary", lambda: sms_reached(out))

    def green_stream(n):
        return greens[n].Stream()

    def graph_smid(capture_on, *replay_on) -> list[int]:
        """The SMs a graph of the probe kernel reaches, captured on one stream and replayed on each of the others."""
        out = torch.zeros(4096, dtype=torch.int32, device="cuda")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(capture_on):
            launch_smid(out)  # warm-up on that stream
            torch.cuda.synchronize()
            with torch.cuda.graph(graph, stream=capture_on):
                launch_smid(out)
        reached = []
        for stream in replay_on:
            out.zero_()
            with torch.cuda.stream(stream):
                graph.replay()
            torch.cuda.synchronize()
            reached.append(sms_reached(out))
        return reached

    def smid_on_green(n):
        s = green_stream(n)
        o = torch.zeros(4096, dtype=torch.int32, device="cuda")
        with torch.cuda.stream(s):
            launch_smid(o)
        torch.cuda.synchronize()
        eager = sms_reached(o)
        plain = torch.cuda.Stream()
        # a graph captured on the green stream, replayed there and on an ordinary stream
        graph_green, graph_plain = graph_smid(s, s, plain)
        # round 42: the converse, a graph captured on an ordinary stream replayed on the green one. If it is confined
        # there, a canonical pass could take its SM share per launch from the stream alone (one capture, two streams,
        # as CanonicalPass's urgent stream does for priorities) instead of a capture per share
        (ordinary_graph_on_green,) = graph_smid(plain, s)
        return {"eager": eager, "graph_on_green": graph_green, "graph_on_ordinary": graph_plain,
                "ordinary_graph_on_green": ordinary_graph_on_green}

    for n in sizes:
        step(f"smid_green_{n}", lambda n=n: smid_on_green(n))

    def bits(n):
        from llm42.kernels.batch_invariant_matmul import matmul

        s = green_stream(n)
        torch.manual_seed(0)
        found = {}
        for m, nn, k in ((256, 960, 576), (2048, 3072, 576), (7, 576, 1536), (256, 49152, 576)):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(nn, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
            ref_c, ref_t = F.linear(x, w), matmul(x, w)
            with torch.cuda.stream(s):
                c, t = F.linear(x, w), matmul(x, w)
            torch.cuda.synchronize()
            found[f"{m}x{nn}x{k}"] = {"cublas_same": bool(torch.equal(c, ref_c)), "triton_same": bool(torch.equal(t, ref_t))}
        return found

    for n in sizes:
        step(f"bits_green_{n}", lambda n=n: bits(n))

    # contention, every workload a CUDA graph: "fast" = 300 small GEMMs (256 x 576 -> 3072), "canonical" = 120 wide
    # ones (2048 x 576 -> 3072), each captured on the stream it is replayed on
    torch.manual_seed(1)
    xf = torch.randn(256, 576, device="cuda", dtype=torch.bfloat16)
    xc = torch.randn(2048, 576, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(3072, 576, device="cuda", dtype=torch.bfloat16) / 24

    def capture(stream, fn):
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=stream):
            fn()
        torch.cuda.synchronize()
        return g

    main = torch.cuda.Stream()
    g_fast = capture(main, lambda: [F.linear(xf, w) for _ in range(300)])

    def timed(side_stream, reps=15):
        g_side = capture(side_stream, lambda: [F.linear(xc, w) for _ in range(120)]) if side_stream else None
        times, side_times = [], []
        for _ in range(reps):
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            c, d = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if g_side is not None:
                with torch.cuda.stream(side_stream):
                    c.record()
                    g_side.replay()
                    d.record()
            with torch.cuda.stream(main):
                a.record()
                g_fast.replay()
                b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
            if g_side is not None:
                side_times.append(c.elapsed_time(d))
        side_alone = None
        if g_side is not None:
            torch.cuda.synchronize()
            c, d = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(side_stream):
                c.record()
                g_side.replay()
                d.record()
            torch.cuda.synchronize()
            side_alone = round(c.elapsed_time(d), 4)
        return {"fast_ms": round(statistics.median(times), 4),
                "side_ms": round(statistics.median(side_times), 4) if side_times else None,
                "side_alone_ms": side_alone}

    step("contention_alone", lambda: timed(None))
    step("contention_ordinary", lambda: timed(torch.cuda.Stream()))
    for n in sizes:
        step(f"contention_green_{n}", lambda n=n: timed(green_stream(n)))
    print("done", flush=True)


if __name__ == "__main__":
    main()
