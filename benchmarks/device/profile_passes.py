"""What one canonical pass costs on the device, against a fast decode step: do wider verify passes pay?

    PYTHONPATH=src python3 benchmarks/device/profile_passes.py --out passes.json [--model smollm2|8b|tiny]
        [--device cuda|cpu] [--reps 20] [--warmup 3] [--context 600] [--max-canonical-tokens 2048] [--layers N]
        [--canonical-gemm cublas|triton] [--canonical-attention tiled|chunked] [--key-chunk 512] [--kernel-profile]
        [--fast-decode-kernel split|deterministic] [--det-fractions 0,0.1,0.5] [--decode-only] [--seqs 256]

One ``DVRGenerator`` (random weights of the model's shape, bf16 on CUDA, fp32 on the CPU; window 32 x
group 8, R = 256; max_num_seqs 256) is built and never stepped: its own canonical pass
(``gen.verifier.canonical_pass``) and K/V store (``gen.kv``, random K/V everywhere) are driven directly.
256 requests hold ``--context`` prior positions. Timed, each ``--reps`` times after ``--warmup`` warm-ups:

- verify passes of 1, 4, 8, 16, 32, 64 windows of 32 rows (requests 0 .., each window at positions
  context .. context + 31), capped at ``--max-canonical-tokens`` rows. A pass of more than R rows computes
  results for at most R rows (``wanted``): there the first 256 rows (``result_rows`` in the JSON);
- prompt-chunk passes of 256, 512, 1024, 2048 rows (one request, positions context .., wanted = its last row);
- the fast path's decode step at batch 64, 128, 256 (position context), through the generator's
  ``DecodeState`` and, on CUDA, a replay of its ``DecodeGraphs``; on the CPU the eager step. With
  ``--fast-decode-kernel deterministic`` (``FastPolicy(decode_kernel="deterministic")``, on the canonical
  attention's bits: the tiled kernel's one-row launch, or with ``--canonical-attention chunked`` the chunked
  kernel's, each row's chunks in parallel) once per ``--det-fractions`` value: that share of the decode slots
  (every k-th slot) is deterministic. ``--decode-only`` skips the passes.

Per pass: host ms of ``stage`` (perf_counter), device ms of ``_run`` (CUDA events; the wall time on the CPU),
``launch`` + ``wait`` (host clock), ``launch`` alone until it returns (``launch_host_ms``) and the graph replays'
host time alone (``replay_host_ms``); median and p90, the bucket and ms per real row. Per decode batch: host
ms of ``stage_batch``, device ms of the step, ms per row; each pass is also given in decode steps of batch 256.
``--canonical-slices N``: the passes in N layer slices (``DVRGenerator(canonical_slices=N)``); each pass row also
gives each slice's device ms (``slice_device_ms``). ``--host-profile``: also cProfile the launches of every pass
timed (``host_profile``, round 35: own ms per launch by function). ``--kernel-profile``: instead, the generator runs eagerly (no CUDA graphs: the profiler sees every kernel) and one
pass of each verify and prompt-chunk shape runs under ``torch.profiler`` after the warm-ups; its kernels are summed
by class (GEMM, attention, row ops, other: ``profile_canonical_prefill.kernel_class``) with the top kernels, under
``kernel_profile`` in the JSON (kernel time is what a graph replays; the eager launches add host time only).
``--beside`` (CUDA, round 36): also a decode step of 64 / 128 rows beside passes of 1, 4, 8, 64 windows and a
512-row prompt chunk on two streams (each alone, both launch orders, and both with the decode step on a stream of the
highest priority), and the fused alternative, one pass carrying the windows and the decode rows as one-row segments
(``beside`` in the JSON; ``time_beside``, ``beside_table``).
On the CPU the defaults shrink to a check that takes seconds: the ``tiny`` model (llm42.bench.models) with 1
layer, context 32, max 512 canonical rows, 5 reps after 1 warm-up, 1 torch thread (all overridable).
A diagnostic, not a benchmark.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from llm42 import DVRGenerator, SamplingParams  # noqa: E402
from llm42.bench.devicetime import synchronize  # noqa: E402
from llm42.bench.models import tiny_config  # noqa: E402
from llm42.bench.passes import canonical_segments  # noqa: E402
from llm42.model.config import llama31_8b_config  # noqa: E402
from llm42.model.weights import random_weights  # noqa: E402
from llm42.policies import FastPolicy  # noqa: E402
from llm42.policies.fixed_shape import DEFAULT_KEY_CHUNK, GEMMS, FixedShapePolicy  # noqa: E402
from llm42.runner import Segment  # noqa: E402
from profile_canonical_prefill import kernel_class  # noqa: E402
from profile_serving import smollm2_shape  # noqa: E402

WINDOW, GROUP, MAX_SEQS = 32, 8, 256
# (reps, warm-ups, context, max_canonical_tokens, layers) when not given. The CPU's canonical pass is exact
# arithmetic in PyTorch, and a 2,048-row prompt chunk at 600 positions takes seconds even for the tiny model:
# the CPU check runs small passes
DEFAULTS = {"cuda": (20, 3, 600, 2048, None), "cpu": (5, 1, 32, 512, 1)}
WINDOW_COUNTS = (1, 4, 8, 16, 32, 64)
CHUNK_ROWS = (256, 512, 1024, 2048)
DECODE_BATCHES = (64, 128, 256)
BESIDE_WINDOWS, BESIDE_BATCHES = (1, 4, 8, 64), (64, 128)  # --beside: passes of these windows beside these decode steps
PARAMS = SamplingParams(deterministic=True)  # greedy rows: the sampler's cheapest variant


def stats(times: list[float]) -> dict:
    """Median and p90 (nearest rank) of a list of milliseconds."""
    ordered = sorted(times)
    return {"median": round(statistics.median(ordered), 4), "p90": round(ordered[math.ceil(0.9 * len(ordered)) - 1], 4)}


def device_ms(fn, device: torch.device) -> float:
    """``fn()``'s milliseconds on the device (CUDA events around it on the current stream), else the wall time."""
    if device.type != "cuda":
        t0 = time.perf_counter()
        fn()
        return 1e3 * (time.perf_counter() - t0)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def time_pass(cp, kv, segments: list[Segment], wanted: list[int] | None, *, reps: int, warmup: int,
              device) -> dict:
    """stage (host), _run (device) and launch + wait (host) of one pass, ``reps`` times after the warm-ups."""
    per_row = [(s.params, s.seed, pos + 1) for s in segments for pos in range(s.start, s.end)]
    stage, run, launch, launch_host, replay_host = [], [], [], [], []
    slices: list[list[float]] = [[] for _ in range(cp.num_slices)] if cp.num_slices > 1 else []
    for i in range(warmup + reps):
        synchronize(device)  # stage's pinned buffers are free, no work queued before it
        t0 = time.perf_counter()
        inputs = cp.stage(segments, kv, per_row, wanted=wanted)
        t1 = time.perf_counter()
        run_ms = device_ms(lambda: cp._run(inputs), device)  # noqa: B023 - called right here
        synchronize(device)
        t2 = time.perf_counter()
        result = cp.launch(segments, kv, per_row, wanted=wanted)
        t_launched = time.perf_counter()
        result.wait()
        t3 = time.perf_counter()
        synchronize(device)
        t4 = time.perf_counter()
        cp._run(inputs)  # the replays' host time alone: nothing queued before them
        t5 = time.perf_counter()
        synchronize(device)
        slice_ms = [device_ms(lambda k=k: cp._run_slices(inputs, k, k + 1), device) for k in range(len(slices))]
        if i >= warmup:
            stage.append(1e3 * (t1 - t0))
            run.append(run_ms)
            launch.append(1e3 * (t3 - t2))
            launch_host.append(1e3 * (t_launched - t2))
            replay_host.append(1e3 * (t5 - t4))
            for k, ms in enumerate(slice_ms):
                slices[k].append(ms)
    rows = len(per_row)
    bucket = cp.bucket_for(rows)
    device_stats = stats(run)
    return {"rows": rows, "bucket": bucket, "segments": len(segments),
            "result_rows": rows if bucket == cp.num_rows else len(wanted if wanted is not None else segments),
            "stage_host_ms": stats(stage), "device_ms": device_stats, "launch_wait_ms": stats(launch),
            "launch_host_ms": stats(launch_host), "replay_host_ms": stats(replay_host),
            "device_ms_per_row": round(device_stats["median"] / rows, 5),
            # canonical_slices: each slice's device ms (the last with the head, without the sampler)
            **({"slice_device_ms": [stats(v)["median"] for v in slices]} if slices else {})}


def host_profile(cp, kv, segments: list[Segment], wanted: list[int] | None, *, reps: int, device) -> list[dict]:
    """cProfile of ``reps`` launches of one pass (each waited for outside the profile): the 30 functions with the
    most own time (ms per launch, calls per launch): where a launch's host time goes."""
    import cProfile
    import pstats

    per_row = [(s.params, s.seed, pos + 1) for s in segments for pos in range(s.start, s.end)]
    profiler = cProfile.Profile()
    for _ in range(reps):
        synchronize(device)
        profiler.enable()
        result = cp.launch(segments, kv, per_row, wanted=wanted)
        profiler.disable()
        result.wait()
    rows = []
    for (path, line, name), (_, calls, own, cumulative, _) in pstats.Stats(profiler).stats.items():
        rows.append({"function": f"{Path(path).name}:{line}({name})", "calls": round(calls / reps, 2),
                     "own_ms": round(1e3 * own / reps, 4), "cumulative_ms": round(1e3 * cumulative / reps, 4)})
    rows.sort(key=lambda r: -r["own_ms"])
    return rows[:30]


def kernel_profile(gen: DVRGenerator, cp, kv, prompt_rid: int, *, context: int, warmup: int) -> list[dict]:
    """One eager pass per shape (verify passes of 8 and 64 windows, prompt chunks of 256 and 2,048 rows, as far as
    ``max_rows`` allows) under ``torch.profiler``: kernel milliseconds by class and the top kernels."""
    from torch.profiler import ProfilerActivity, profile

    device = gen.device
    shapes = []
    for windows in (w for w in (8, 64) if w * WINDOW <= cp.max_rows and w <= gen.config.max_num_seqs):
        segments = canonical_segments(gen.cfg, window=WINDOW, group=windows, context=context + WINDOW, params=PARAMS)
        shapes.append(("verify", segments, list(range(cp.num_rows)) if windows * WINDOW > cp.num_rows else None))
    for rows in (r for r in (256, 2048) if r <= cp.max_rows):
        tokens = tuple((7 * i + 3) % gen.cfg.vocab_size for i in range(rows))
        shapes.append(("chunk", [Segment(prompt_rid, tokens, context, PARAMS, 0)], [rows - 1]))
    out = []
    for kind, segments, wanted in shapes:
        per_row = [(s.params, s.seed, pos + 1) for s in segments for pos in range(s.start, s.end)]
        for _ in range(max(1, warmup)):
            cp._run(cp.stage(segments, kv, per_row, wanted=wanted))
        synchronize(device)
        activities = [ProfilerActivity.CUDA] if device.type == "cuda" else [ProfilerActivity.CPU]
        with profile(activities=activities) as prof:
            cp._run(cp.stage(segments, kv, per_row, wanted=wanted))
            synchronize(device)
        by_class: dict[str, float] = {}
        kernels = []
        for evt in prof.key_averages():
            us = getattr(evt, "device_time_total", 0.0) if device.type == "cuda" else evt.self_cpu_time_total
            kind_of = getattr(evt, "device_type", None)  # kernels are CUDA events; skip any CPU-side op's total
            if us <= 0 or (device.type == "cuda" and kind_of is not None and "CUDA" not in str(kind_of)):
                continue
            cls = kernel_class(evt.key)
            by_class[cls] = round(by_class.get(cls, 0.0) + us / 1e3, 4)
            kernels.append({"name": evt.key[:120], "class": cls, "ms": round(us / 1e3, 4), "calls": evt.count})
        kernels.sort(key=lambda k: -k["ms"])
        out.append({"kind": kind, "rows": len(per_row), "bucket": cp.bucket_for(len(per_row)),
                    "kernel_ms_by_class": by_class, "kernel_ms_total": round(sum(by_class.values()), 4),
                    "kernel_launches": sum(k["calls"] for k in kernels), "top": kernels[:12]})
    return out


def set_deterministic_share(gen: DVRGenerator, share: float, context: int) -> int:
    """Re-admit decode slots 0 .. seqs - 1 with every k-th slot deterministic (``share`` of them); returns how many."""
    num_seqs = gen.config.max_num_seqs
    num_det = round(share * num_seqs)
    det = {round(i * num_seqs / num_det) for i in range(num_det)} if num_det else set()
    state = gen.decode_state
    for rid in range(num_seqs):
        state.admit(rid, rid, SamplingParams(deterministic=rid in det), 0)
        state.set_next(rid, rid * 7 % gen.cfg.vocab_size, context)
    state.flush()
    return len(det)


def time_decode(gen: DVRGenerator, batch: int, position: int, *, reps: int, warmup: int, device) -> dict:
    """One decode step of slots 0 .. batch - 1 at ``position``: graph replay on CUDA, eager elsewhere."""
    state, graphs = gen.decode_state, gen.fast_step.decode_graphs
    saved = state.snapshot()
    stage, run = [], []
    for i in range(warmup + reps):
        state.restore(saved)  # every step decodes the same rows at the same position
        synchronize(device)
        t0 = time.perf_counter()
        num_rows = graphs.bucket_for(batch) if graphs is not None else batch
        variant = state.stage_batch(list(range(batch)), num_rows)
        t1 = time.perf_counter()
        if graphs is not None:
            ms = device_ms(lambda: graphs.run(batch, variant), device)  # noqa: B023
        else:
            ms = device_ms(lambda: state.decode(batch, variant=variant,  # noqa: B023
                                                max_context_len=position + 1), device)
        if i >= warmup:
            stage.append(1e3 * (t1 - t0))
            run.append(ms)
    state.restore(saved)
    device_stats = stats(run)
    return {"batch": batch, "bucket": num_rows, "graphed": graphs is not None, "stage_host_ms": stats(stage),
            "device_ms": device_stats, "device_ms_per_row": round(device_stats["median"] / batch, 5)}


def decode_segments(cfg, rids: range, position: int) -> list[Segment]:
    """One single-row segment per request of ``rids`` at ``position``: a fast decode row carried by a pass."""
    return [Segment(rid, ((rid * 7) % cfg.vocab_size,), position, PARAMS, 0) for rid in rids]


def time_beside(gen: DVRGenerator, cp, kv, segments: list[Segment], wanted: list[int] | None, batch: int, *,
                reps: int, warmup: int, device) -> dict:
    """A decode step of ``batch`` slots and a pass of ``segments`` side by side on two streams (CUDA only).

    Per rep, both staged first, then one start event; ``fast_first``: the decode graph on the caller's stream, then
    the pass on a side stream (the engine's order: a fast step launched, a pass behind it); ``pass_first``: the
    other way; ``*_priority``: the same with the decode step on a stream of the device's highest priority and the
    pass on one of the lowest (``DVRGenerator(prioritize_fast=True)``'s streams; a graph replayed on a stream runs at
    that stream's priority). Device ms from the start to each one's end event, and to both done; against each
    alone."""
    state, graphs = gen.decode_state, gen.fast_step.decode_graphs
    per_row = [(s.params, s.seed, pos + 1) for s in segments for pos in range(s.start, s.end)]
    side = torch.cuda.Stream(device, priority=0)
    high = torch.cuda.Stream(device, priority=-1)
    saved = state.snapshot()
    out: dict = {}
    for order in ("alone", "fast_first", "pass_first", "fast_first_priority", "pass_first_priority"):
        main = high if order.endswith("_priority") else torch.cuda.current_stream(device)
        fast_ms, pass_ms, both_ms = [], [], []
        for i in range(warmup + reps):
            state.restore(saved)
            synchronize(device)
            variant = state.stage_batch(list(range(batch)), graphs.bucket_for(batch))
            inputs = cp.stage(segments, kv, per_row, wanted=wanted)
            synchronize(device)
            start, fast_end, pass_end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            start.record(main)
            side.wait_event(start)

            def run_fast():
                with torch.cuda.stream(main):  # noqa: B023
                    graphs.run(batch, variant)  # noqa: B023 - called in this rep
                    fast_end.record(main)  # noqa: B023

            def run_pass():
                with torch.cuda.stream(side):
                    cp._run(inputs)  # noqa: B023
                    pass_end.record(side)  # noqa: B023

            if order == "alone":  # one after the other on the caller's stream: each one's own device time
                run_fast()
                side.wait_event(fast_end)
                run_pass()
            elif order.startswith("fast_first"):
                run_fast()
                run_pass()
            else:
                run_pass()
                run_fast()
            torch.cuda.synchronize(device)
            if i >= warmup:
                f, p = start.elapsed_time(fast_end), start.elapsed_time(pass_end)
                fast_ms.append(f)
                pass_ms.append(p - f if order == "alone" else p)
                both_ms.append(max(f, p))
        out[order] = {"fast_ms": stats(fast_ms)["median"], "pass_ms": stats(pass_ms)["median"],
                      "both_ms": stats(both_ms)["median"], "fast_p90": stats(fast_ms)["p90"]}
    state.restore(saved)
    return {"batch": batch, "pass_rows": len(per_row), **out}


def beside_table(gen: DVRGenerator, cp, kv, args, prompt_rid: int) -> list[dict]:
    """``--beside``: decode steps of 64 / 128 rows beside passes of 1, 4, 8, 64 windows and a 512-row prompt chunk;
    and the fused alternative: one pass of the windows plus the decode step's rows as one-row segments (requests
    after the windows'), timed alone."""
    rows = []
    counts = [w for w in BESIDE_WINDOWS if w * WINDOW <= cp.max_rows and w <= args.seqs]
    first_free = max(counts)  # the decode rows' requests come after every window's (requests 0 .. windows - 1)
    for batch in (b for b in BESIDE_BATCHES if b <= args.seqs):
        for windows in counts:
            segments = canonical_segments(gen.cfg, window=WINDOW, group=windows, context=args.context + WINDOW,
                                          params=PARAMS)
            wanted = list(range(cp.num_rows)) if windows * WINDOW > cp.num_rows else None
            row = time_beside(gen, cp, kv, segments, wanted, batch, reps=args.reps, warmup=args.warmup,
                              device=gen.device)
            row["pass"] = f"{windows} windows"
            # fused: the windows and the decode rows in one pass (requests past the windows' for the decode rows)
            fused = segments + decode_segments(gen.cfg, range(first_free, first_free + batch), args.context)
            num = windows * WINDOW + batch
            # results: every row up to R (as the verify rows above R: the first R rows)
            fused_wanted = None if num <= cp.num_rows else list(range(cp.num_rows))
            if num <= cp.max_rows and first_free + batch <= args.seqs:  # requests prepare() gave K/V
                timed = time_pass(cp, kv, fused, fused_wanted, reps=args.reps, warmup=args.warmup, device=gen.device)
                row["fused_pass_ms"] = timed["device_ms"]["median"]
                row["fused_rows"] = timed["rows"]
                row["fused_bucket"] = timed["bucket"]
            rows.append(row)
        chunk = Segment(prompt_rid, tuple((7 * i + 3) % gen.cfg.vocab_size for i in range(512)), args.context,
                        PARAMS, 0)
        if 512 <= cp.max_rows:
            row = time_beside(gen, cp, kv, [chunk], [511], batch, reps=args.reps, warmup=args.warmup,
                              device=gen.device)
            row["pass"] = "512-row prompt chunk"
            rows.append(row)
    return rows


def build(args) -> tuple[DVRGenerator, int]:
    device = torch.device(args.device)
    model = args.model or ("smollm2" if device.type == "cuda" else "tiny")
    max_chunk = max([r for r in CHUNK_ROWS if r <= args.max_canonical_tokens], default=0)
    positions = max(4096, -(-(args.context + max_chunk + 64) // 1024) * 1024)
    cfg = {"smollm2": smollm2_shape, "8b": lambda: llama31_8b_config(max_position_embeddings=positions),
           "tiny": lambda: tiny_config(positions)}[model]()
    if args.layers:
        cfg = dataclasses.replace(cfg, num_layers=args.layers)
    if model == "smollm2":  # the real checkpoint's 8,192 positions (the shape's default is 4,096)
        cfg = dataclasses.replace(cfg, max_position_embeddings=max(8192, positions))
    per_request = -(-(args.context + 64) // 16) * 16
    kv_tokens = args.seqs * per_request + args.context + max_chunk + 256
    if args.context + max(max_chunk, WINDOW) + 16 > cfg.max_position_embeddings:
        raise SystemExit(f"--context {args.context} + {max_chunk} rows exceeds the model's "
                         f"{cfg.max_position_embeddings} positions")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    weights = random_weights(cfg, seed=0, dtype=dtype, device=device)
    canonical = FixedShapePolicy(gemm=args.canonical_gemm, attention_kernel=args.canonical_attention,
                                 key_chunk=args.key_chunk)
    chunk = args.key_chunk if args.canonical_attention == "chunked" else None
    gen = DVRGenerator(weights, cfg, window=WINDOW, group=GROUP, max_num_seqs=args.seqs,
                       max_canonical_tokens=args.max_canonical_tokens, kv_cache_tokens=kv_tokens,
                       prefix_cache=False, canonical_policy=canonical,
                       fast_policy=FastPolicy(decode_kernel=args.fast_decode_kernel, canonical_key_chunk=chunk),
                       use_cuda_graphs=not args.kernel_profile, canonical_slices=args.canonical_slices)
    args.model = model
    return gen, max_chunk


def prepare(gen: DVRGenerator, context: int, max_chunk: int) -> int:
    """Random K/V everywhere; requests 0 .. seqs - 1 with context + 32 positions (decode slots too), one prompt."""
    kv, device = gen.kv, gen.device
    generator = torch.Generator(device=device).manual_seed(0)
    for layer in range(gen.cfg.num_layers):
        for cache in (kv.layers().k[layer], kv.layers().v[layer]):
            cache.copy_(torch.randn(cache.shape, generator=generator, device=device, dtype=torch.float32))
    for rid in range(gen.config.max_num_seqs):
        kv.allocate(rid, context + 64)
        kv.append(rid, context + WINDOW)
        gen.decode_state.admit(rid, rid, SamplingParams(), 0)  # slot rid decodes request rid
        gen.decode_state.set_next(rid, rid * 7 % gen.cfg.vocab_size, context)
    gen.decode_state.flush()
    prompt_rid = gen.config.max_num_seqs
    kv.allocate(prompt_rid, context + max_chunk)
    kv.append(prompt_rid, context + max_chunk)
    return prompt_rid


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", choices=("smollm2", "8b", "tiny"), default=None,
                    help="default: smollm2 on CUDA, tiny on the CPU")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--reps", type=int, default=None, help="default 20 on CUDA, 2 on the CPU")
    ap.add_argument("--warmup", type=int, default=None, help="default 3 on CUDA, 1 on the CPU")
    ap.add_argument("--context", type=int, default=None, help="prior positions; default 600 on CUDA, 32 on the CPU")
    ap.add_argument("--max-canonical-tokens", type=int, default=None, help="default 2048 on CUDA, 512 on the CPU")
    ap.add_argument("--layers", type=int, default=None, help="override the model's layer count (default: the "
                    "model's on CUDA, 1 on the CPU)")
    ap.add_argument("--cpu-threads", type=int, default=1, help="torch intra-op threads on the CPU")
    ap.add_argument("--canonical-gemm", choices=GEMMS, default="cublas",
                    help="FixedShapePolicy(gemm=...): the canonical pass's GEMM on CUDA (part of the canonical config)")
    ap.add_argument("--canonical-attention", choices=("tiled", "chunked"), default="tiled",
                    help="FixedShapePolicy(attention_kernel=...): the canonical pass's attention (canonical config)")
    ap.add_argument("--key-chunk", type=int, default=DEFAULT_KEY_CHUNK, help="the chunked kernel's keys per chunk")
    ap.add_argument("--fast-decode-kernel", choices=("split", "deterministic"), default="split",
                    help="FastPolicy(decode_kernel=...): deterministic rows on the canonical attention's bits")
    ap.add_argument("--det-fractions", default="0",
                    help="comma-separated shares of the decode slots that are deterministic (decode timings)")
    ap.add_argument("--decode-only", action="store_true", help="time the decode steps only (no passes)")
    ap.add_argument("--seqs", type=int, default=MAX_SEQS, help="decode slots (max_num_seqs); 64 windows need 64")
    ap.add_argument("--canonical-slices", type=int, default=1,
                    help="DVRGenerator(canonical_slices=N): each pass in N layer slices; also times each slice")
    ap.add_argument("--host-profile", action="store_true",
                    help="also cProfile the launches of every pass timed (host time by function)")
    ap.add_argument("--beside", action="store_true",
                    help="CUDA: also time decode steps beside passes on two streams, and fused passes (beside_table)")
    ap.add_argument("--kernel-profile", action="store_true",
                    help="eager passes under torch.profiler: kernel time by class per pass shape (no timings)")
    args = ap.parse_args()
    defaults = DEFAULTS["cuda" if torch.device(args.device).type == "cuda" else "cpu"]
    for name, value in zip(("reps", "warmup", "context", "max_canonical_tokens", "layers"), defaults):
        if getattr(args, name) is None:
            setattr(args, name, value)
    if torch.device(args.device).type == "cpu":
        # one intra-op thread: on a shared machine (a test run beside it) two OpenMP threads on two cores made
        # a 256-row pass of the tiny model take 1.7 s instead of 0.034 s
        torch.set_num_threads(args.cpu_threads)
    gen, max_chunk = build(args)
    device, cp, kv = gen.device, gen.verifier.canonical_pass, gen.kv
    prompt_rid = prepare(gen, args.context, max_chunk)
    R = cp.num_rows
    t = time.perf_counter()
    cp.stage(canonical_segments(gen.cfg, window=WINDOW, group=1, context=args.context + WINDOW, params=PARAMS), kv)
    synchronize(device)
    result = {
        "args": vars(args), "model_config": dataclasses.asdict(gen.cfg), "torch": torch.__version__,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": str(gen.weights.dtype), "R": R, "max_rows": cp.max_rows, "buckets": list(cp.buckets),
        "canonical_graphed": cp.is_graphed, "bind_and_capture_s": round(time.perf_counter() - t, 3),
        "notes": ["device_ms: CUDA events around CanonicalPass._run (graph replays) / the decode graph's replay; "
                  "on the CPU the wall time of the eager call",
                  f"verify passes of more than R = {R} rows compute results for their first {R} rows only "
                  "(result_rows); a real verifier would need every window row",
                  "all rows greedy; K/V random; the generator is never stepped"],
        "verify_windows": [], "prompt_chunks": [], "decode": [],
    }
    if args.kernel_profile:
        result["kernel_profile"] = kernel_profile(gen, cp, kv, prompt_rid, context=args.context,
                                                  warmup=args.warmup)
        gen.close()
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        for row in result["kernel_profile"]:
            print(f"{row['kind']:7s} {row['rows']:5d} rows  kernels {row['kernel_ms_total']:7.3f} ms  "
                  + "  ".join(f"{k} {v:.3f}" for k, v in sorted(row["kernel_ms_by_class"].items())))
        return
    for windows in (w for w in WINDOW_COUNTS if w * WINDOW <= cp.max_rows and w <= args.seqs
                    and not args.decode_only):
        segments = canonical_segments(gen.cfg, window=WINDOW, group=windows, context=args.context + WINDOW,
                                      params=PARAMS)
        wanted = list(range(R)) if windows * WINDOW > R else None
        row = time_pass(cp, kv, segments, wanted, reps=args.reps, warmup=args.warmup, device=device)
        result["verify_windows"].append({"windows": windows, **row})
        if args.host_profile:
            result.setdefault("host_profile", {})[f"{windows}_windows"] = host_profile(
                cp, kv, segments, wanted, reps=args.reps, device=device)
    for rows in (r for r in CHUNK_ROWS if r <= cp.max_rows and not args.decode_only):
        tokens = tuple((7 * i + 3) % gen.cfg.vocab_size for i in range(rows))
        segment = Segment(prompt_rid, tokens, args.context, PARAMS, 0)
        row = time_pass(cp, kv, [segment], [rows - 1], reps=args.reps, warmup=args.warmup, device=device)
        result["prompt_chunks"].append(row)
        if args.host_profile:
            result.setdefault("host_profile", {})[f"chunk_{rows}"] = host_profile(
                cp, kv, [segment], [rows - 1], reps=args.reps, device=device)
    for share in [float(f) for f in args.det_fractions.split(",") if f]:
        num_det = set_deterministic_share(gen, share, args.context)
        for batch in (b for b in DECODE_BATCHES if b <= args.seqs):
            row = time_decode(gen, batch, args.context, reps=args.reps, warmup=args.warmup, device=device)
            result["decode"].append({"det_fraction": share, "deterministic_slots": num_det, **row})
    step_ms = result["decode"][len([b for b in DECODE_BATCHES if b <= args.seqs]) - 1]["device_ms"]["median"]
    for row in result["verify_windows"] + result["prompt_chunks"]:
        row["decode_steps_256"] = round(row["device_ms"]["median"] / step_ms, 3)
    if args.beside and device.type == "cuda" and gen.fast_step.decode_graphs is not None:
        result["beside"] = beside_table(gen, cp, kv, args, prompt_rid)
    gen.close()
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for r in result.get("beside", []):
        orders = " | ".join(f"{order}: fast {r[order]['fast_ms']:.3f} both {r[order]['both_ms']:.3f}"
                            for order in ("fast_first", "pass_first", "fast_first_priority", "pass_first_priority"))
        fused = f" | fused {r['fused_rows']} rows ({r['fused_bucket']}): {r['fused_pass_ms']:.3f}" if (
            "fused_pass_ms" in r) else ""
        print(f"beside: decode {r['batch']:4d} rows + {r['pass']:22s} ({r['pass_rows']:5d} rows): alone fast "
              f"{r['alone']['fast_ms']:.3f} pass {r['alone']['pass_ms']:.3f} | {orders}{fused}")
    for name, rows in result.get("host_profile", {}).items():
        print(f"host profile, {name}: " + "; ".join(f"{r['function']} {r['own_ms']:.3f}" for r in rows[:12]))

    print(f"{result['device']}  {args.model} ({gen.cfg.num_layers} layers, {result['dtype']})  R={R}  "
          f"buckets={result['buckets']}  context={args.context}  bind+capture {result['bind_and_capture_s']} s")
    print(f"{'kind':10s} {'rows':>5s} {'bucket':>6s} {'results':>7s} {'stage ms':>9s} {'device ms':>10s} "
          f"{'p90':>8s} {'launch+wait':>11s} {'launch':>7s} {'replay':>7s} {'us/row':>8s} {'steps@256':>9s}")
    for kind, key, label in (("verify", "verify_windows", "windows"), ("chunk", "prompt_chunks", None),
                             ("decode", "decode", None)):
        for r in result[key]:
            name = f"{kind} {r[label]}w" if label else (f"{kind} d{r['det_fraction']:g}" if kind == "decode" else kind)
            rows = r.get("rows", r.get("batch"))
            lw = (f"{r['launch_wait_ms']['median']:11.3f} {r['launch_host_ms']['median']:7.3f} "
                  f"{r['replay_host_ms']['median']:7.3f}" if "launch_wait_ms" in r else f"{'':27s}")
            steps = f"{r['decode_steps_256']:9.2f}" if "decode_steps_256" in r else ""
            print(f"{name:10s} {rows:5d} {r['bucket']:6d} {r.get('result_rows', rows):7d} "
                  f"{r['stage_host_ms']['median']:9.3f} {r['device_ms']['median']:10.3f} "
                  f"{r['device_ms']['p90']:8.3f} {lw} {1e3 * r['device_ms_per_row']:8.2f} {steps}")


if __name__ == "__main__":
    main()
