"""Host time of a canonical pass's staging and applying, and of an engine step, two source trees side by side
(round 28).

    PYTHONPATH=src python3 benchmarks/cpu_host_ab.py --base /path/to/other/checkout \\
        [--out benchmarks/results/cpu_host_ab.json] [--rounds 3] [--reps 40]

The device does not wait for a pass's kernels alone: the host stages its rows (tokens, positions, slots, block
tables, sampling rows), launches it, and later reads its results back and applies the commit rule, on the thread
that also drives the fast steps. Round 25's real SmolLM2 runs launched 381-590 passes in 5-6 s of dvr@50 (3.0-3.6
ms a step), so a pass's host milliseconds are a share of the step. Here, on this CPU, each case runs
``Verifier.launch`` then ``Verifier.finish`` with the pass's device work taken out (``CanonicalPass._run``
returns the result it computed the first time: host time only), median of ``--reps`` after 5 warm-ups, over the
tiny model (staging does not depend on the model's size):

- ``verify_64_windows``: 64 sampled windows of 32 rows (2,048 rows, each window its own params and seed) at 2,400
  positions, as round 23's ``cpu_staging.py`` case;
- ``verify_8_windows``: 8 greedy windows (256 rows, an R-row pass);
- ``prompt_chunk_2048``: one prompt chunk of 2,048 rows at 2,400 positions (its last row's result);
- ``mixed_24_windows_chunk``: 24 windows and a 1,024-row chunk;
- ``flush_after_commits_16`` / ``flush_after_admits_8``: ``DecodeState.flush`` of the device-state updates a step
  queues after a pass's commits (16 windows) or after admitting 8 requests (round 39: one packed copy);
- ``fast_prefill_16_prompts``: the fast path's prompt staging (``FastPrefill.stage``, the same row staging: the free
  prompts of a prefill-heavy step), 16 prompt chunks of 128 rows at positions 0-127;
- ``engine_step_1000_det_<share>``: whole engine steps (``DVRGenerator.step``) with 1,000 requests decoding (8-token
  prompts, 300 outputs, that share deterministic), over a one-layer model of width 32 and 64 tokens, so that the
  model's CPU time is small: the step's host parts (``_STEP_PARTS``: views, scheduling, plan checks, drafts ahead,
  the fast step's launch less the model's work in it, reading tokens back, a pass's launch less its model work,
  applying passes), ms per step over ``--reps`` steps after 12, summed, with the objects built before them frozen out
  of the garbage collector's full passes (their pauses are ``cpu_gc_pauses.py``'s). The digest: every request's
  committed tokens after the steps.

``--steps-only``: the engine-step cases alone, for more rounds in the same time (round 35: one run of every case gave
engine steps 1.25x and 1.23x, a six-round run of the steps alone 0.99x and 1.02x; each case's ``*_rounds_ms`` now
lists every round).

Each tree runs in its own process (``--base``'s ``src`` and this checkout's), ``--rounds`` times in turn (ABAB...), and
every process also writes a digest of what it staged and committed per case: the two trees must stage and commit
the same rows (``same_bits``). Host time only, on this machine's CPU: what it saves on a GPU run is not measured.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONTEXT, WINDOW = 2400, 32


def _cases():
    """(name, [(rid, is_prefill, num_rows, sampled)]) for the measured passes."""
    return {
        "verify_64_windows": [(rid, False, WINDOW, True) for rid in range(64)],
        "verify_8_windows": [(rid, False, WINDOW, False) for rid in range(8)],
        "prompt_chunk_2048": [(64, True, 2048, False)],
        "mixed_24_windows_chunk": [(rid, False, WINDOW, rid % 2 == 0) for rid in range(24)] + [(64, True, 1024, False)],
    }


def measure(reps: int, *, steps_only: bool = False) -> dict:
    """In this process (whichever tree is on sys.path): each case's median host ms and digest (``steps_only``: the
    engine-step cases alone)."""
    if steps_only:
        return {f"engine_step_1000_det_{share:g}": _engine_steps(share, reps) for share in STEP_SHARES}
    import dataclasses

    import torch

    from llm42 import DVRGenerator, SamplingParams
    from llm42.bench.models import tiny_config
    from llm42.model.weights import random_weights
    from llm42.runner import Segment
    from llm42.verify.canonical_pass import CanonicalPass
    from llm42.verify.verifier import CanonicalWork

    torch.set_num_threads(1)
    cfg = tiny_config(8192)
    gen = DVRGenerator(random_weights(cfg, seed=0), cfg, window=WINDOW, group=8, max_num_seqs=81,
                       max_canonical_tokens=2048, max_fast_tokens=2048, wide_verify=True,
                       kv_cache_tokens=81 * (CONTEXT + 2112), prefix_cache=False)
    kv, verifier, cp = gen.kv, gen.verifier, gen.verifier.canonical_pass
    for rid in range(64):
        kv.allocate(rid, CONTEXT + 64)
        kv.append(rid, CONTEXT - 1)
    kv.allocate(64, CONTEXT + 2048)
    kv.append(64, CONTEXT)
    real_run, cache = CanonicalPass._run, {}

    def host_only_run(self, inputs, *args):  # the device work once per shape; later passes reuse its result
        key = (self._bucket, self._results, self._variant)  # (*args: round 34's first slice, 0 here)
        if key not in cache:
            cache[key] = real_run(self, inputs, *args)
        return cache[key]

    CanonicalPass._run = host_only_run
    out = {}
    for name, spec in _cases().items():
        work = []
        for rid, is_prefill, rows, sampled in spec:
            params = (SamplingParams(deterministic=True, temperature=0.5 + rid / 128, top_p=0.9, top_k=rid % 3 * 20)
                      if sampled else SamplingParams(deterministic=True))
            start = CONTEXT if is_prefill else CONTEXT - 1
            tokens = tuple((rid * 31 + i) % cfg.vocab_size for i in range(rows))
            work.append(CanonicalWork(Segment(rid, tokens, start, params, 1000 + rid), is_prefill=is_prefill,
                                      is_last_chunk=is_prefill))
        digest = hashlib.sha256()

        def one(record=False):
            launched = verifier.launch(work, kv)
            if record:
                rows = cp._rows
                digest.update(rows.ints.numpy().tobytes())
                digest.update(rows.block_tables.numpy().tobytes())
                n = cp._results
                digest.update(cp._sampling_ints[:, :n].numpy().tobytes())
                digest.update(cp._sampling_floats[:, :n].numpy().tobytes())
            commits = verifier.finish(launched, kv, truncate=False)
            if record:
                digest.update(repr([dataclasses.astuple(c) for c in commits]).encode())

        one(record=True)
        for _ in range(5):
            one()
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            one()
            times.append((time.perf_counter() - t) * 1e3)
        out[name] = {"ms": statistics.median(times), "digest": digest.hexdigest()}
    prefill = gen.fast_step.fast_prefill
    segments = []
    for i in range(16):
        rid = 65 + i
        kv.allocate(rid, 256)
        kv.append(rid, 128)
        segments.append(Segment(rid, tuple((rid * 7 + j) % cfg.vocab_size for j in range(128)), 0,
                                SamplingParams(temperature=0.8, seed=rid), rid))
    digest = hashlib.sha256()
    prefill.stage(segments, kv)
    digest.update(prefill._rows.ints.numpy().tobytes())
    digest.update(prefill._rows.block_tables.numpy().tobytes())
    digest.update(prefill._sampling_ints.numpy().tobytes())
    for _ in range(5):
        prefill.stage(segments, kv)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        prefill.stage(segments, kv)
        times.append((time.perf_counter() - t) * 1e3)
    out["fast_prefill_16_prompts"] = {"ms": statistics.median(times), "digest": digest.hexdigest()}
    out.update(_flush_cases(gen.decode_state, reps))
    gen.close()
    for share in STEP_SHARES:
        out[f"engine_step_1000_det_{share:g}"] = _engine_steps(share, reps)
    return out


STEP_SHARES = (0.0, 0.5)


def _flush_cases(state, reps: int) -> dict:
    """``DecodeState.flush`` of the updates a step queues after a pass's commits (16 windows: each request's next
    token and position, its protected prefix, a few table entries) and after admitting 8 requests (their sampling
    parameters and tables): median ms over ``reps`` flushes (round 39 packs them into one copy)."""
    import torch

    def after_commits():
        for slot in range(16):
            state.set_next(slot, 100 + slot, 2400 + slot)
            state.set_protect(slot, 2400 + slot)
        state._table_writes.extend((slot, 150, 7 + slot) for slot in range(4))

    def after_admits():
        for slot in range(8):
            state._params[slot] = (0.5 + slot / 16, slot * 5, 0.9, 1000 + slot, slot % 2)
            state._table_writes.extend((slot, col, slot * 8 + col) for col in range(8))

    out = {}
    for name, queue in (("flush_after_commits_16", after_commits), ("flush_after_admits_8", after_admits)):
        times = []
        for i in range(reps + 5):
            queue()
            t = time.perf_counter()
            state.flush()
            if i >= 5:
                times.append((time.perf_counter() - t) * 1e3)
        digest = hashlib.sha256()
        for field in ("tokens", "positions", "protect", "temperature", "top_p", "top_k", "seeds", "is_deterministic",
                      "tables"):
            digest.update(getattr(state, field).to(torch.float64).numpy().tobytes())
        out[name] = {"ms": statistics.median(times), "digest": digest.hexdigest()}
    return out


# the engine step's host parts, timed by wrapping these (owner module, class or None, name) in either tree; the
# model's work inside the fast step and the pass (the last three) is subtracted from the launches that run it
_STEP_PARTS = {
    "views": ("llm42.engine.requests", "RequestPool", "views"),
    "schedule": ("llm42.scheduler", "DefaultScheduler", "schedule"),
    "validate_plan": ("llm42.generator", None, "validate_plan"),
    "drafts_ahead": ("llm42.generator", "DVRGenerator", "_with_drafts_ahead"),
    "fast_launch": ("llm42.engine.fast_step", "FastStep", "launch"),
    "fast_read": ("llm42.engine.fast_step", "FastStep", "read"),
    # a tree before round 35 kept them on the generator (``_launch_canonical``, ``_finish_canonical``)
    "pass_launch": ("llm42.engine.passes", "CanonicalPasses", "launch"),
    "pass_apply": ("llm42.engine.passes", "CanonicalPasses", "apply_oldest"),
    "model_decode": ("llm42.engine.decode_state", "DecodeState", "decode"),
    "model_prefill": ("llm42.engine.fast_step", "FastStep", "_launch_prefill"),
    "model_pass": ("llm42.verify.canonical_pass", "CanonicalPass", "_run"),
}


_BEFORE_ROUND_35 = {"pass_launch": ("llm42.generator", "DVRGenerator", "_launch_canonical"),
                    "pass_apply": ("llm42.generator", "DVRGenerator", "_finish_canonical")}


def wrap_timed(targets: dict, acc: dict) -> list:
    """Wrap each ``targets[label]`` = (owner, attribute name) so its calls add their host seconds to ``acc[label]``;
    returns (owner, name, original) for each, to restore with ``unwrap``."""
    import functools

    saved = []
    for label, (owner, name) in targets.items():
        fn = getattr(owner, name)
        saved.append((owner, name, fn))

        def timed(*args, _fn=fn, _label=label, **kwargs):
            t = time.perf_counter()
            try:
                return _fn(*args, **kwargs)
            finally:
                acc[_label] += time.perf_counter() - t

        setattr(owner, name, functools.wraps(fn)(timed))
    return saved


def unwrap(saved: list) -> None:
    for owner, name, fn in saved:
        setattr(owner, name, fn)


def _timed_parts(acc: dict) -> list:
    """``wrap_timed`` of every ``_STEP_PARTS`` entry (in whichever tree this process imports)."""
    import importlib.util

    targets = {}
    for label, (module, cls, name) in _STEP_PARTS.items():
        if label in _BEFORE_ROUND_35 and importlib.util.find_spec(module) is None:
            module, cls, name = _BEFORE_ROUND_35[label]
        owner = importlib.import_module(module)
        targets[label] = (getattr(owner, cls) if cls else owner, name)
    return wrap_timed(targets, acc)


def _engine_steps(share: float, reps: int) -> dict:
    import gc
    import random

    from llm42 import DVRGenerator, SamplingParams
    from llm42.model.config import ModelConfig, RopeConfig
    from llm42.model.weights import random_weights

    cfg = ModelConfig(family="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                      num_kv_heads=1, head_dim=16, max_position_embeddings=1024, rms_norm_eps=1e-5,
                      rope=RopeConfig(theta=10000.0), eos_token_ids=(2,), bos_token_id=1)
    gen = DVRGenerator(random_weights(cfg, seed=0), cfg, window=WINDOW, group=8, max_num_seqs=1024,
                       max_fast_tokens=2048, max_canonical_tokens=2048, wide_verify=True, kv_cache_tokens=1024 * 330,
                       prefix_cache=False)
    rng = random.Random(0)
    rids = [gen.submit([rng.randrange(3, 64) for _ in range(8)],
                       SamplingParams(max_new_tokens=300, deterministic=rng.random() < share, ignore_eos=True,
                                      temperature=0.8 if i % 2 else 0.0, seed=i)) for i in range(1000)]
    for _ in range(12):
        gen.step()
    acc = dict.fromkeys(_STEP_PARTS, 0.0)
    saved = _timed_parts(acc)
    # the objects built so far out of the collector's full passes (gc.freeze, here in the script: the base tree has
    # no frozen_gc), so that one ~80 ms pass falling into some part does not swamp a 40-step median of the host
    # work; the pauses themselves are cpu_gc_pauses.py's measure
    gc.collect()
    gc.freeze()
    try:
        for _ in range(reps):
            gen.step()
    finally:
        gc.unfreeze()
        unwrap(saved)
    parts = {label: total / reps * 1e3 for label, total in acc.items()}
    host = (sum(parts[k] for k in ("views", "schedule", "validate_plan", "drafts_ahead", "fast_read", "pass_apply"))
            + parts["fast_launch"] - parts["model_decode"] - parts["model_prefill"]
            + parts["pass_launch"] - parts["model_pass"])
    digest = hashlib.sha256(repr([gen.committed_tokens(rid) for rid in rids]).encode())
    gen.close()
    return {"ms": host, "parts_ms": {k: round(v, 4) for k, v in parts.items()}, "digest": digest.hexdigest()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="the other checkout (its src/ is imported in its processes)")
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/cpu_host_ab.json"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--steps-only", action="store_true",
                    help="the engine-step cases alone (a closer look at them: more rounds in the same time)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.reps, steps_only=args.steps_only)))
        return
    trees = {"base": Path(args.base).resolve(), "this": REPO}
    runs: dict[str, list[dict]] = {label: [] for label in trees}
    for r in range(args.rounds):
        for label in (("base", "this") if r % 2 == 0 else ("this", "base")):
            env = dict(os.environ, PYTHONPATH=str(trees[label] / "src"))
            done = subprocess.run([sys.executable, __file__, "--base", args.base, "--child", "--reps", str(args.reps),
                                   *(["--steps-only"] if args.steps_only else [])],
                                  env=env, capture_output=True, text=True, check=True)
            runs[label].append(json.loads(done.stdout.strip().splitlines()[-1]))
    commits = {}
    for label, tree in trees.items():  # a checkout's commit, when it is one (a plain copy of src/ has none)
        done = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        commits[label] = done.stdout.strip() if done.returncode == 0 else None
    result = {"command": "python3 benchmarks/cpu_host_ab.py --base <checkout of the base commit>"
                         + (" --steps-only" if args.steps_only else ""),
              "base": str(trees["base"]), "commits": commits, "rounds": args.rounds, "reps": args.reps,
              "cases": {}}
    steps = [f"engine_step_1000_det_{x:g}" for x in STEP_SHARES]
    for name in (steps if args.steps_only else [*_cases(), "fast_prefill_16_prompts", "flush_after_commits_16",
                                                "flush_after_admits_8", *steps]):
        base = statistics.median(run[name]["ms"] for run in runs["base"])
        this = statistics.median(run[name]["ms"] for run in runs["this"])
        digests = {run[name]["digest"] for label in runs for run in runs[label]}
        result["cases"][name] = {"base_ms": round(base, 4), "this_ms": round(this, 4), "ratio": round(this / base, 3),
                                 "same_bits": len(digests) == 1,
                                 # each round's (the spread: one machine's noise between processes)
                                 **{f"{label}_rounds_ms": [round(run[name]["ms"], 4) for run in runs[label]]
                                    for label in runs}}
        if "parts_ms" in runs["this"][0][name]:
            for label in runs:
                result["cases"][name][f"{label}_parts_ms"] = {
                    part: round(statistics.median(run[name]["parts_ms"][part] for run in runs[label]), 4)
                    for part in _STEP_PARTS}
        print(f"{name}: base {base:.3f} ms, this {this:.3f} ms (x{this / base:.2f}), same bits: {len(digests) == 1}",
              flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
