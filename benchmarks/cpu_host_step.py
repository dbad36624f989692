"""Host time of an engine step's bookkeeping at serving concurrency, and round 26's inlined request views side by side.

    PYTHONPATH=src python3 benchmarks/cpu_host_step.py [--out benchmarks/results/cpu_host_step.json] [--reps 30]

Every engine step builds a ``RequestView`` per running request for the scheduler (``RequestPool.views``), schedules,
validates the plan, and reads the fast step's tokens back (``FastStep.read``): Python work that grows with the
running requests and that the device does not wait for only while it is shorter than a step's kernels (round 25's
real SmolLM2 runs: 3.0-3.4 ms a step on the H200). Here, on this CPU, a ``DVRGenerator`` over the tiny model (the
bookkeeping does not depend on the model) serves N requests of 8-token prompts and 300 outputs, a share of them
deterministic, until all decode; then:

- ``views``: the pool's views built as before round 26 (``LegacyViews``: each view from the request's properties)
  and as now (the properties inlined in ``Request.view``), median of ``--reps`` after 3 warm-ups, alternating, on
  the same pool; the two tuples are checked equal;
- ``decode_rows_check``: ``validate_plan``'s check of the scheduler's fast decode rows, as before round 26 (a
  ``take`` and the properties per row) and as now (``_are_decode_rows_valid``), the same way;
- ``step_parts``: 30 more engine steps with each part timed on the host clock (``views``, ``schedule``,
  ``validate_plan``, ``fast.read``, the decode rows' staging, drafts ahead, applying passes), ms per step.

Host time only, on this machine's CPU: what it saves on a GPU run is not measured here (dvr_timeline.py shows
whether the device waits for the host).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "benchmarks"))

from cpu_host_ab import unwrap, wrap_timed  # noqa: E402
from llm42 import DVRGenerator, SamplingParams  # noqa: E402
from llm42 import generator as generator_module  # noqa: E402
from llm42.bench.models import tiny_config  # noqa: E402
from llm42.engine.decode_state import DecodeState  # noqa: E402
from llm42.engine.passes import CanonicalPasses  # noqa: E402
from llm42.engine.fast_step import FastStep  # noqa: E402
from llm42.engine.requests import Request, RequestPool  # noqa: E402
from llm42.model.weights import random_weights  # noqa: E402
from llm42.scheduler import DefaultScheduler, RequestView, SchedulerState, _are_decode_rows_valid  # noqa: E402


def legacy_view(req: Request, window: int) -> RequestView:
    """``Request.view`` before round 26: each field from the request's properties."""
    if req.is_deterministic:
        depth = req.window_depth(window)
        return RequestView(req.rid, True, req.num_prompt_tokens, req.prefill_frontier, len(req.token_ids),
                           min(req.num_candidates, depth), req.num_speculable(window), req.arrival,
                           bool(req.risky) and req.risky[0] < depth, req.max_new_tokens)
    return RequestView(req.rid, False, req.num_prompt_tokens, req.num_prefilled,
                       len(req.token_ids) + req.num_pending, 0, 0, req.arrival, False, req.max_new_tokens)


def legacy_views(pool: RequestPool) -> tuple[RequestView, ...]:
    """``RequestPool.views`` before round 26."""
    chain = pool.chain_prefill
    return tuple(legacy_view(r, pool.window) for r in pool.running.values()
                 if (not r.is_verifying or (chain and r.is_chainable())) and r.num_generated < r.max_new_tokens)


def legacy_decode_rows_check(plan, views: dict[int, RequestView]) -> set[int]:
    """``validate_plan``'s check of the fast decode rows before round 26: one ``take`` and the properties per row."""
    seen: set[int] = set()
    for rid in plan.fast_decode:
        if rid not in views or rid in seen:
            raise AssertionError(rid)
        seen.add(rid)
        v = views[rid]
        if v.is_prefill or (v.is_deterministic and v.num_speculable == 0):
            raise AssertionError(rid)
    return seen


def serving(num_requests: int, det_share: float) -> DVRGenerator:
    cfg = tiny_config(1024)
    gen = DVRGenerator(random_weights(cfg, seed=0), cfg, window=32, group=8, max_num_seqs=1024, max_fast_tokens=2048,
                       max_canonical_tokens=2048, wide_verify=True, kv_cache_tokens=1024 * 330, prefix_cache=False)
    rng = random.Random(0)
    for i in range(num_requests):
        gen.submit([rng.randrange(3, cfg.vocab_size) for _ in range(8)],
                   SamplingParams(max_new_tokens=300, deterministic=rng.random() < det_share, ignore_eos=True,
                                  temperature=0.8 if i % 2 else 0.0, seed=i))
    for _ in range(12):  # every prompt prefilled, deterministic requests drafting and verifying
        gen.step()
    return gen


def side_by_side(legacy, now, reps: int) -> tuple[float, float]:
    """Median host ms of ``legacy()`` and ``now()``, called in turn ``reps`` times after 3 warm-ups each."""
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(3):
        legacy(), now()
    for _ in range(reps):
        for fn, out in zip((legacy, now), times):
            t = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times[0]), statistics.median(times[1])


def views_case(gen: DVRGenerator, reps: int) -> dict:
    pool = gen._pool
    legacy, now = side_by_side(lambda: legacy_views(pool), pool.views, reps)
    return {"num_views": len(pool.views()), "legacy_ms": round(legacy, 4), "round26_ms": round(now, 4),
            "ratio": round(now / legacy, 3), "views_equal": legacy_views(pool) == pool.views()}


def decode_rows_case(gen: DVRGenerator, reps: int) -> dict:
    """The plan's fast decode rows checked as before round 26 and as now (``_are_decode_rows_valid``), on the
    scheduler's own plan for the pool's current state; medians of ``reps``, alternating."""
    views = gen._pool.views()
    state = SchedulerState(views, gen.canonical_config.window, gen.canonical_config.group,
                           gen.config.max_fast_tokens, 0, gen.max_canonical_tokens, gen._max_canonical_results, 0)
    plan = gen.scheduler.schedule(state)
    by_rid = {v.rid: v for v in views}
    old = lambda: legacy_decode_rows_check(plan, by_rid)  # noqa: E731
    new = lambda: _are_decode_rows_valid(plan.fast_decode, by_rid)  # noqa: E731
    legacy, now = side_by_side(old, new, reps)
    return {"num_rows": len(plan.fast_decode), "legacy_ms": round(legacy, 4), "round26_ms": round(now, 4),
            "ratio": round(now / legacy, 3), "both_valid": new() and len(old()) > 0}


def step_parts(gen: DVRGenerator, steps: int) -> dict:
    """ms per step of each timed part over ``steps`` engine steps (class attributes wrapped, then restored)."""
    parts = {"views": (RequestPool, "views"), "schedule": (DefaultScheduler, "schedule"),
             "validate_plan": (generator_module, "validate_plan"), "fast.read": (FastStep, "read"),
             "decode staging": (DecodeState, "stage_batch"),
             "drafts ahead": (generator_module.DVRGenerator, "_with_drafts_ahead"),
             "applying passes": (CanonicalPasses, "apply_oldest")}
    acc = dict.fromkeys(parts, 0.0)
    saved = wrap_timed(parts, acc)
    try:
        for _ in range(steps):
            gen.step()
    finally:
        unwrap(saved)
    return {label: round(total / steps * 1e3, 4) for label, total in acc.items()}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/cpu_host_step.json"))
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--requests", default="256,1000")
    ap.add_argument("--det-shares", default="0,0.5")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    result = {"torch": torch.__version__, "reps": args.reps, "steps": args.steps, "cases": {}}
    for n in (int(x) for x in args.requests.split(",")):
        for share in (float(x) for x in args.det_shares.split(",")):
            gen = serving(n, share)
            case = {"running": len(gen._pool.running), "views": views_case(gen, args.reps),
                    "decode_rows_check": decode_rows_case(gen, args.reps), "step_parts_ms": step_parts(gen, args.steps)}
            gen.close()
            result["cases"][f"{n}_requests_det_{share:g}"] = case
            v, d = case["views"], case["decode_rows_check"]
            print(f"{n} requests, det share {share:g}: views legacy {v['legacy_ms']:.3f} ms, round 26 "
                  f"{v['round26_ms']:.3f} ms (x{v['ratio']:.2f}, equal {v['views_equal']}); decode rows check "
                  f"legacy {d['legacy_ms']:.3f} ms, round 26 {d['round26_ms']:.3f} ms (x{d['ratio']:.2f}); per step "
                  f"{case['step_parts_ms']}", flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
