"""Where a long prompt's time to first token goes that no kernel takes: the device's idle gaps, and what the host
was doing in each.

    PYTHONPATH=src python3 benchmarks/device/prefill_timeline.py --out timeline.json [--prompt 15000] [--reps 3]
        [--modes free,det] [--model 8b] [--canonical-gemm triton] [--canonical-tile-m 128] [--block-size 16]
        [--rope per_head|rows] [--cprofile] [--max-canonical-tokens N]

One generator as ``llm42.bench.long_prompts`` builds it (CUDA graphs captured first, the long-prompt canonical
config by default). Per mode: ``--reps`` prompts timed plainly (TTFT, the median), then one prompt under
``torch.profiler`` (CPU and CUDA activities) with the engine's phases wrapped in ``record_function`` ranges. From
that trace: the device's busy time (the union of kernel and copy intervals) between submission and the first token,
its idle time, and each idle gap over ``--gap-us`` with the engine phase and CUDA runtime call the host was in at
its middle, summed by phase. ``--rope per_head`` sends RoPE back to round 21's one-program-per-(row, head) kernel
(A/B in one call). A diagnostic: the profiler adds host time of its own.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import sys
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

from llm42 import DVRGenerator, SamplingParams  # noqa: E402
from llm42.bench.long_prompts import first_token_s  # noqa: E402
from llm42.bench.models import build_model  # noqa: E402
from llm42.bench.runner import capture_mixed_graphs, capture_prefill_graphs  # noqa: E402
from llm42.cuda_graphs import Staging  # noqa: E402
from llm42.policies import FastPolicy, FixedShapePolicy  # noqa: E402

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def wrap(obj, name: str, label: str) -> None:
    """Replace ``obj.name`` (a bound method or a function attribute) by one inside a ``record_function`` range."""
    fn = getattr(obj, name)

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with record_function(label):
            return fn(*args, **kwargs)

    setattr(obj, name, wrapped)


def instrument(gen: DVRGenerator) -> None:
    wrap(gen, "_step", "phase:step")
    wrap(gen.scheduler, "schedule", "phase:schedule")
    wrap(gen.fast_step, "launch", "phase:fast_launch")
    wrap(gen.fast_step, "read", "phase:fast_read")
    wrap(gen.passes, "launch", "phase:canonical_launch")
    wrap(gen.passes, "apply_oldest", "phase:canonical_finish")
    wrap(gen, "_admit", "phase:admit")
    for name in ("launch", "finish"):
        if hasattr(gen.verifier, name):
            wrap(gen.verifier, name, f"phase:verifier_{name}")
    original = Staging.host

    def host(self):
        with record_function("phase:staging_wait"):
            return original(self)

    Staging.host = host


def host_profile(gen: DVRGenerator, prompt: list[int], deterministic: bool) -> list[dict]:
    """One prompt under cProfile: the functions that took host time, by own time (CUDA work is asynchronous:
    a wait shows as the waiting call's own time)."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    first_token_s(gen, prompt, deterministic=deterministic)
    profiler.disable()
    stats = pstats.Stats(profiler).stats
    rows = [{"function": f"{Path(file).name}:{line}({name})", "calls": calls, "tottime_ms": tottime * 1e3,
             "cumtime_ms": cumtime * 1e3}
            for (file, line, name), (_, calls, tottime, cumtime, _) in stats.items()]
    return sorted(rows, key=lambda r: -r["tottime_ms"])[:60]


def analyse(trace: dict, gap_us: float) -> dict:
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    marks = [e for e in events if e.get("cat") == "user_annotation" and e["name"] == "ttft"]
    if not marks:
        return {"error": "no ttft range in the trace"}
    t0, t1 = marks[0]["ts"], marks[0]["ts"] + marks[0]["dur"]
    device = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                    if e.get("cat") in DEVICE_CATS and t0 <= e["ts"] <= t1)
    phases = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("phase:")]
    runtime = [e for e in events if e.get("cat") == "cuda_runtime"]

    def active(spans, t):
        inside = [e for e in spans if e["ts"] <= t <= e["ts"] + e["dur"]]
        return min(inside, key=lambda e: e["dur"])["name"] if inside else "-"

    busy, gaps, cursor = 0.0, [], t0
    for start, end in device:
        if start > cursor:
            gaps.append((cursor, start))
        if end > cursor:
            busy += end - max(start, cursor)
            cursor = end
    if t1 > cursor:
        gaps.append((cursor, t1))
    by_phase: dict[str, float] = {}
    listed = []
    for start, end in gaps:
        mid = (start + end) / 2
        phase, call = active(phases, mid), active(runtime, mid)
        key = f"{phase} / {call}"
        by_phase[key] = by_phase.get(key, 0.0) + (end - start) / 1e3
        if end - start >= gap_us:
            listed.append({"at_ms": round((start - t0) / 1e3, 3), "ms": round((end - start) / 1e3, 3),
                           "phase": phase, "runtime_call": call})
    return {"ttft_ms": (t1 - t0) / 1e3, "device_busy_ms": busy / 1e3, "device_idle_ms": (t1 - t0 - busy) / 1e3,
            "first_device_event_ms": (device[0][0] - t0) / 1e3 if device else None,
            "after_last_device_event_ms": (t1 - device[-1][1]) / 1e3 if device else None,
            "idle_ms_by_phase": dict(sorted(by_phase.items(), key=lambda kv: -kv[1])),
            "gaps_over_threshold": listed, "num_device_events": len(device)}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="8b")
    p.add_argument("--prompt", type=int, default=15000)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--modes", default="free,det")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--canonical-gemm", default="triton")
    p.add_argument("--canonical-tile-m", type=int, default=128)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-canonical-tokens", type=int, default=None,
                   help="rows one canonical pass may take (DVRGenerator knob; default: the engine's)")
    p.add_argument("--gap-us", type=float, default=100.0)
    p.add_argument("--rope", choices=("rows", "per_head"), default="rows")
    p.add_argument("--cprofile", action="store_true",
                   help="also one prompt per mode under cProfile: the host's functions by own time (llm42's)")
    args = p.parse_args()
    if args.rope == "per_head":
        from llm42.kernels import fused

        fused.ROPE_ROW_PROGRAMS = False
    device = torch.device("cuda")
    max_positions = args.prompt + 128
    model = build_model(args.model, device=device, dtype=torch.bfloat16, max_positions=max_positions, seed=0)
    gen = DVRGenerator(model.weights, model.cfg, window=32, group=64, max_num_seqs=4, max_fast_tokens=2048,
                       kv_cache_tokens=3 * max_positions, max_model_len=max_positions, block_size=args.block_size,
                       canonical_policy=FixedShapePolicy(gemm=args.canonical_gemm, tile_m=args.canonical_tile_m),
                       fast_policy=FastPolicy(canonical_tile_m=args.canonical_tile_m),
                       max_canonical_tokens=args.max_canonical_tokens)
    notes = capture_prefill_graphs(gen) + capture_mixed_graphs(gen, decode_rows=())
    rng = random.Random(0)

    def prompt(n):
        return [rng.randrange(3, model.cfg.vocab_size) for _ in range(n)]

    modes = [m == "det" for m in args.modes.split(",")]
    for det in modes:  # warm-up: every kernel compiled, every chunk shape seen
        first_token_s(gen, prompt(args.prompt), deterministic=det)
    instrument(gen)
    results = {"args": {k: str(v) for k, v in vars(args).items()}, "notes": notes, "runs": []}
    for det in modes:
        times = [first_token_s(gen, prompt(args.prompt), deterministic=det) * 1e3 for _ in range(args.reps)]
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            with record_function("ttft"):
                first_token_s(gen, prompt(args.prompt), deterministic=det)
            torch.cuda.synchronize()
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            prof.export_chrome_trace(f.name)
            trace = json.loads(Path(f.name).read_text())
        run = {"mode": "det" if det else "free", "ttft_ms_runs": times, "ttft_ms": sorted(times)[len(times) // 2],
               "profiled": analyse(trace, args.gap_us)}
        results["runs"].append(run)
        prof_run = run["profiled"]
        print(f"{run['mode']}: TTFT {run['ttft_ms']:.1f} ms (runs {', '.join(f'{t:.1f}' for t in times)}); "
              f"profiled {prof_run.get('ttft_ms', 0):.1f} ms, device busy {prof_run.get('device_busy_ms', 0):.1f}, "
              f"idle {prof_run.get('device_idle_ms', 0):.1f}", flush=True)
        for key, ms in list(prof_run.get("idle_ms_by_phase", {}).items())[:8]:
            print(f"    idle {ms:8.3f} ms  {key}", flush=True)
        for gap in prof_run.get("gaps_over_threshold", [])[:30]:
            print(f"    gap at {gap['at_ms']:9.3f} ms: {gap['ms']:7.3f} ms  {gap['phase']} / {gap['runtime_call']}",
                  flush=True)
        if args.cprofile:
            run["host_functions"] = host_profile(gen, prompt(args.prompt), det)
            for row in run["host_functions"][:25]:
                print(f"    host {row['tottime_ms']:8.3f} ms own, {row['cumtime_ms']:8.3f} ms with callees, "
                      f"{row['calls']:6d} calls  {row['function']}", flush=True)
        args.out.write_text(json.dumps(results, indent=1))
    gen.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
