"""Which of a fast decode step's kernels a canonical pass beside it slows: kernel by kernel, from CUPTI's trace.

    PYTHONPATH=src python3 benchmarks/device/beside_kernels.py --out beside_kernels.json [--model smollm2]
        [--batch 64] [--windows 1,8] [--chunk 512] [--reps 20] [--context 600]

Round 36 timed a SmolLM2 decode step of 64 rows at 1.47 ms alone and 1.86 ms beside a pass of up to 256 rows
(``profile_passes.py --beside``: CUDA events around the two graphs); this says where the 0.4 ms goes. The same
set-up as ``profile_passes.py`` (one never-stepped ``DVRGenerator``, random weights of the model's shape, random K/V,
``--context`` prior positions, the engine's default canonical policy unless ``--canonical-gemm`` says otherwise). Per
pass shape (``--windows`` verify windows of 32 rows; ``--chunk``: one prompt chunk of that many rows) three profiled
phases, each its own ``torch.profiler`` session and each ``--reps`` replays after warm-ups: the decode graph alone on
a stream of its own, the pass alone on its stream, and the two launched together (decode first, the engine's order).
Kernels are read from the exported trace (``ts``, ``dur``, ``stream``); the decode stream's id is the one its
alone phase ran on. Per phase and replay: the decode step's span (first kernel start to last kernel end), its kernel
time, the gaps between its kernels; per kernel class (``profile_canonical_prefill.kernel_class``) the median time per
replay alone and beside; the kernels (by position in the graph) whose time grew most. Where CUPTI reports no graph
kernels the JSON says so and the tables are empty. A diagnostic, not a benchmark.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from llm42.bench.passes import canonical_segments  # noqa: E402
from llm42.runner import Segment  # noqa: E402
from profile_canonical_prefill import kernel_class  # noqa: E402
from profile_passes import PARAMS, WINDOW, build, prepare  # noqa: E402


def _kernels(prof) -> list[dict]:
    """The trace's kernel events (name, ts, dur in us, stream), in start order."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text()).get("traceEvents", [])
    out = [{"name": e["name"], "ts": float(e["ts"]), "dur": float(e.get("dur", 0.0)),
            "stream": e.get("args", {}).get("stream")}
           for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]
    return sorted(out, key=lambda k: k["ts"])


def _profiled(run, reps: int, warmup: int) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            run()
            torch.cuda.synchronize()
    return _kernels(prof)


def _per_replay(kernels: list[dict], reps: int) -> list[list[dict]]:
    """Split one stream's kernels into ``reps`` equal replays (each replay launches the same graph)."""
    n = len(kernels) // reps if reps else 0
    return [kernels[i * n:(i + 1) * n] for i in range(reps)] if n else []


def _summary(replays: list[list[dict]]) -> dict:
    spans, busy, by_class = [], [], defaultdict(list)
    for ks in replays:
        spans.append((ks[-1]["ts"] + ks[-1]["dur"] - ks[0]["ts"]) / 1e3)
        busy.append(sum(k["dur"] for k in ks) / 1e3)
        per: dict[str, float] = defaultdict(float)
        for k in ks:
            per[kernel_class(k["name"])] += k["dur"] / 1e3
        for c, v in per.items():
            by_class[c].append(v)
    med = statistics.median
    return {"replays": len(replays), "kernels_per_replay": len(replays[0]) if replays else 0,
            "span_ms": round(med(spans), 4) if spans else None,
            "kernel_ms": round(med(busy), 4) if busy else None,
            "gap_ms": round(med(spans) - med(busy), 4) if spans else None,
            "by_class_ms": {c: round(med(v), 4) for c, v in sorted(by_class.items())}}


def _growth(alone: list[list[dict]], beside: list[list[dict]], top: int = 12) -> list[dict]:
    """Per kernel position in the graph: median duration alone and beside; the ``top`` that grew most, and the
    growth summed over all positions by kernel name."""
    if not alone or not beside or len(alone[0]) != len(beside[0]):
        return []
    med = statistics.median
    rows = []
    for i in range(len(alone[0])):
        a = med(r[i]["dur"] for r in alone)
        b = med(r[i]["dur"] for r in beside)
        rows.append({"index": i, "name": alone[0][i]["name"][:100], "alone_us": round(a, 2), "beside_us": round(b, 2),
                     "grew_us": round(b - a, 2)})
    return sorted(rows, key=lambda r: -r["grew_us"])[:top]


def _growth_by_name(alone: list[list[dict]], beside: list[list[dict]]) -> list[dict]:
    if not alone or not beside or len(alone[0]) != len(beside[0]):
        return []
    med = statistics.median
    by: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for i in range(len(alone[0])):
        name = alone[0][i]["name"][:100]
        by[name][0] += med(r[i]["dur"] for r in alone)
        by[name][1] += med(r[i]["dur"] for r in beside)
        by[name][2] += 1
    rows = [{"name": n, "count": int(c), "alone_us": round(a, 1), "beside_us": round(b, 1),
             "grew_us": round(b - a, 1)} for n, (a, b, c) in by.items()]
    return sorted(rows, key=lambda r: -r["grew_us"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", choices=("smollm2", "8b"), default="smollm2")
    ap.add_argument("--batch", type=int, default=64, help="the decode step's rows")
    ap.add_argument("--windows", default="1,8", help="verify passes of these many windows of 32 rows")
    ap.add_argument("--chunk", type=int, default=512, help="a prompt chunk pass of this many rows (0: none)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--context", type=int, default=600)
    ap.add_argument("--canonical-gemm", default="cublas")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("beside_kernels.py needs CUDA")
    bargs = SimpleNamespace(device="cuda", model=args.model, max_canonical_tokens=2048, context=args.context,
                            seqs=256, layers=None, canonical_gemm=args.canonical_gemm, canonical_attention="tiled",
                            key_chunk=512, fast_decode_kernel="split", kernel_profile=False, canonical_slices=1)
    from llm42.policies.fixed_shape import DEFAULT_KEY_CHUNK
    bargs.key_chunk = DEFAULT_KEY_CHUNK
    gen, max_chunk = build(bargs)
    cp, kv, device = gen.verifier.canonical_pass, gen.kv, gen.device
    prompt_rid = prepare(gen, args.context, max_chunk)
    state, graphs = gen.decode_state, gen.fast_step.decode_graphs
    if graphs is None:
        raise SystemExit("no decode graphs")
    fast_stream, side = torch.cuda.Stream(device), torch.cuda.Stream(device)
    saved = state.snapshot()
    shapes = [(f"{w} windows", canonical_segments(gen.cfg, window=WINDOW, group=w, context=args.context + WINDOW,
                                                  params=PARAMS), None)
              for w in (int(x) for x in args.windows.split(",") if x)]
    if args.chunk:
        tokens = tuple((7 * i + 3) % gen.cfg.vocab_size for i in range(args.chunk))
        shapes.append((f"{args.chunk}-row prompt chunk", [Segment(prompt_rid, tokens, args.context, PARAMS, 0)],
                       [args.chunk - 1]))
    result = {"args": vars(args), "device": torch.cuda.get_device_name(device), "torch": torch.__version__,
              "R": cp.num_rows, "shapes": []}
    for label, segments, wanted in shapes:
        per_row = [(s.params, s.seed, pos + 1) for s in segments for pos in range(s.start, s.end)]
        state.restore(saved)
        variant = state.stage_batch(list(range(args.batch)), graphs.bucket_for(args.batch))
        inputs = cp.stage(segments, kv, per_row, wanted=wanted)
        torch.cuda.synchronize()

        def run_fast():
            fast_stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(fast_stream):
                graphs.run(args.batch, variant)  # noqa: B023

        def run_pass():
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                cp._run(inputs)  # noqa: B023

        def run_both():
            run_fast()
            run_pass()

        fast_alone = _profiled(run_fast, args.reps, args.warmup)
        pass_alone = _profiled(run_pass, args.reps, args.warmup)
        both = _profiled(run_both, args.reps, args.warmup)
        fast_ids = {k["stream"] for k in fast_alone}
        entry = {"pass": label, "pass_rows": len(per_row), "kernels_seen": len(fast_alone) > 0}
        if len(fast_ids) == 1 and fast_alone:
            sid = fast_ids.pop()
            fa = _per_replay(fast_alone, args.reps)
            fb = _per_replay([k for k in both if k["stream"] == sid], args.reps)
            pa = _per_replay(pass_alone, args.reps)
            pb = _per_replay([k for k in both if k["stream"] != sid], args.reps)
            entry.update({"fast_alone": _summary(fa), "fast_beside": _summary(fb), "pass_alone": _summary(pa),
                          "pass_beside": _summary(pb), "fast_growth_top": _growth(fa, fb),
                          "fast_growth_by_name": _growth_by_name(fa, fb)})
        else:
            entry["note"] = f"decode stream ids seen alone: {sorted(map(str, fast_ids))}"
        result["shapes"].append(entry)
        fa_s, fb_s = entry.get("fast_alone", {}), entry.get("fast_beside", {})
        print(f"{label:24s} fast alone span {fa_s.get('span_ms')} kernels {fa_s.get('kernel_ms')} gaps "
              f"{fa_s.get('gap_ms')} | beside span {fb_s.get('span_ms')} kernels {fb_s.get('kernel_ms')} gaps "
              f"{fb_s.get('gap_ms')} | pass alone {entry.get('pass_alone', {}).get('span_ms')} beside "
              f"{entry.get('pass_beside', {}).get('span_ms')}", flush=True)
        print("   by class alone  ", fa_s.get("by_class_ms"))
        print("   by class beside ", fb_s.get("by_class_ms"))
        for r in entry.get("fast_growth_by_name", [])[:8]:
            print(f"   {r['grew_us']:8.1f} us  x{r['count']:3d}  {r['alone_us']:8.1f} -> {r['beside_us']:8.1f}  "
                  f"{r['name']}")
    state.restore(saved)
    gen.close()
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
