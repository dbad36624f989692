"""When the device runs fast steps and canonical passes in a served run, and who is still running: a timeline.

    PYTHONPATH=src python3 benchmarks/device/dvr_timeline.py --model <GGUF|8b|tiny> --out timeline.json
        [--variants default,canon_priority] [--modes nondet,dvr@50] [--num-requests 1000] [--png timeline.png]
        [--online-load 0.7 --online-requests 500]

The offline request set of ``dvr_ab.py`` (the same model options, workload and variants), each (variant, mode) run
once after an untimed warm-up, with three hooks while the run is timed: every engine step's host span and the
requests running (free / deterministic) when it returns; every fast step's device span (CUDA events on the stream it
is launched on, before and after ``FastStep.launch``); every canonical pass's device span (events on the pass's
stream around its graphs' replays, ``CanonicalPass._run_with_details``) with its rows and the priority of its stream.
On the CPU the spans are host clock readings (a CPU pass runs inside the step). Events are read once, after the run.
``--online-load L`` (round 34): the runs are served online instead (``run_online``), the first ``--online-requests``
requests arriving as a Poisson process at L x the first variant's offline nondet capacity, measured first without
the hooks, as ``dvr_ab.py`` does: the online free gaps' question, whether a fast step beside a pass is longer for its
rows (``fast_us_per_row_p50_alone`` / ``_beside_a_pass``) or has more of them.

What it answers (round 25 left these open; docs/benchmarks.md): how much longer a fast step takes while a pass runs
beside it (``fast_ms`` alone / beside a pass), how long a pass takes served against its rows, how busy the device is
with either over the run and in its tail (after the last free request finished, only deterministic requests left),
and how those move with a variant (``canonical_priority``, the Triton GEMM, ``order``). A diagnostic, not a benchmark:
its throughput figures are ``dvr_ab.py``'s.

``--det-progress K`` (round 27): at every K-th step, what each deterministic request in decode does (``DET_KINDS``:
a window draft, a draft ahead, idle with its window in a pass, idle due, idle otherwise; and the idle ones that could
have drafted ahead but found the step's rows spent), its share over the run and in the tail, the request-steps per
committed deterministic token, and the same for the run's last finishers (round 25's longest deterministic replies
took ~1.7 steps per token: this says where the rest went). Its loop over the running requests is host time in the
sampled steps.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import dvr_ab  # noqa: E402
from llm42.bench import runner as runner_module  # noqa: E402
from llm42.bench.hostprobe import host_probe  # noqa: E402
from llm42.bench.modes import mode_by_name  # noqa: E402
from llm42.bench.runner import run_offline, run_online  # noqa: E402
from llm42.bench.workloads import poisson_arrivals  # noqa: E402
from llm42.engine.fast_step import FastStep  # noqa: E402
from llm42.verify.canonical_pass import CanonicalPass  # noqa: E402

BIN_MS = 100.0  # the timeline's bins
# what a deterministic request in decode does in a step (``DetProgress``): drafts a candidate of its window, drafts
# ahead of a window that is due or in a pass, or gets no row: its window in a pass (ahead drafts used up, or no spare
# row), due and waiting for a pass, or neither (``other``: e.g. its length limit reached)
DET_KINDS = ("window", "ahead", "idle_in_pass", "idle_due", "idle_other")


class DetProgress:
    """Where deterministic requests' steps go: at every ``every``-th fast launch, each deterministic request past its
    prompt is counted in one of ``DET_KINDS`` (with the plan the step launches), in total and per request; and
    ``idle_could_draft``: those idle that could have drafted ahead (``num_draftable_ahead`` > 0) but got no row (the
    step's rows were spent). Sampled steps stand for ``every`` steps each. Host work per sampled step (a loop over
    the running requests): the diagnostic's own steps are that much slower on the host."""

    def __init__(self, every: int):
        self.every = every
        self.totals = dict.fromkeys(DET_KINDS, 0)
        self.idle_could_draft = 0
        self.per_request: dict[int, dict[str, int]] = {}
        self.in_tail = dict.fromkeys(DET_KINDS, 0)  # steps with no free request running
        self.samples = 0

    def record(self, pool, plan) -> None:
        self.samples += 1
        rows = set(plan.fast_decode)
        window = pool.window
        running = pool.running.values()
        is_tail = not any(not r.is_deterministic for r in running)
        for req in running:
            if not req.is_deterministic or req.num_prefilled < req.num_prompt_tokens:
                continue
            is_due = req.num_speculable(window) == 0  # the scheduler's "ready to verify" (a full or last window)
            if req.rid in rows:
                kind = "ahead" if req.is_verifying or is_due else "window"
            elif req.is_verifying:
                kind = "idle_in_pass"
            elif is_due:
                kind = "idle_due"
            else:
                kind = "idle_other"
            if kind.startswith("idle") and req.num_draftable_ahead(window) > 0:
                self.idle_could_draft += 1
            self.totals[kind] += 1
            if is_tail:
                self.in_tail[kind] += 1
            mine = self.per_request.setdefault(req.rid, dict.fromkeys(DET_KINDS, 0))
            mine[kind] += 1

    def summary(self, committed: dict[int, int], last: list[int]) -> dict:
        """Shares of the sampled request-steps by kind; request-steps per committed token (every kind, scaled by
        ``every``); the same for the requests ``last`` (the run's last finishers) with ``committed`` tokens each."""
        total = sum(self.totals.values())
        tokens = sum(committed.get(rid, 0) for rid in self.per_request)

        def shares(counts: dict[str, int]) -> dict[str, float]:
            n = sum(counts.values())
            return {k: round(v / n, 4) if n else None for k, v in counts.items()}

        out = {"every": self.every, "sampled_steps": self.samples, "request_steps": total * self.every,
               "shares": shares(self.totals), "tail_shares": shares(self.in_tail),
               "idle_could_draft_share": round(self.idle_could_draft / total, 4) if total else None,
               "steps_per_token": round(total * self.every / tokens, 3) if tokens else None, "last_finishers": []}
        for rid in last:
            mine = self.per_request.get(rid)
            if mine and committed.get(rid):
                out["last_finishers"].append({"rid": rid, "tokens": committed[rid],
                                              "steps_per_token": round(sum(mine.values()) * self.every
                                                                       / committed[rid], 3),
                                              "shares": shares(mine)})
        return out


class _Clock:
    """A span's ends: CUDA events on the current stream (read after the run), or host readings on the CPU."""

    def __init__(self, is_cuda: bool):
        self.is_cuda = is_cuda
        self.ref = None
        self.t_ref = 0.0

    def start(self) -> None:
        self.t_ref = time.perf_counter()
        if self.is_cuda:
            self.ref = torch.cuda.Event(enable_timing=True)
            self.ref.record()

    def mark(self):
        if not self.is_cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def ms(self, mark) -> float:
        """Milliseconds since ``start`` (the device's clock on CUDA: call after the device is drained)."""
        return self.ref.elapsed_time(mark) if self.is_cuda else (mark - self.t_ref) * 1e3


class Timeline:
    """While active (``with``), records the timed run's steps, fast steps and canonical passes (class hooks, restored
    on exit). Recording starts at the run's first timed step (``_Tracker.step``): a warm-up inside the run is not in
    it."""

    def __init__(self, is_cuda: bool, *, det_every: int = 0):
        self.clock = _Clock(is_cuda)
        self.det = DetProgress(det_every) if det_every else None
        # the run's records (engine request id -> the workload request's record), not its tracker: a tracker holds
        # its generator, which the run's end (``runner._release``: a collection, the CUDA cache emptied) must find
        # unreferenced; held here, it stayed as cyclic garbage while the next run built its generator (round 38, an
        # H100: the second variant's decode graphs ran out of memory and that run went eagerly, 14.7 ms a fast step)
        self.records: dict | None = None
        self.is_recording = False
        self.step_index = -1
        self.steps: list[dict] = []
        self.fast: list[tuple[int, object, object, int]] = []  # (step, start, end, rows)
        # (step, start, end, rows, stream priority, slice, final): slice None for a whole pass, else the sliced pass's
        # first slice in the span (canonical_slices); final: the span that ends the pass (its head and sampler)
        self.passes: list[tuple[int, object, object, int, int, int | None, bool]] = []
        self._saved: list[tuple[type, str, object]] = []

    def _patch(self, owner: type, name: str, make) -> None:
        original = getattr(owner, name)
        self._saved.append((owner, name, original))
        setattr(owner, name, make(original))

    def __enter__(self) -> Timeline:
        timeline = self

        def step(original):
            def hooked(tracker, t0):
                if not timeline.is_recording:
                    timeline.is_recording = True
                    timeline.records = tracker.records
                    timeline.clock.start()
                timeline.step_index += 1
                start = time.perf_counter()
                try:
                    return original(tracker, t0)
                finally:
                    running = tracker.gen._pool.running.values()
                    num_det = sum(r.is_deterministic for r in running)
                    timeline.steps.append({"step": timeline.step_index,
                                           "host_start_ms": (start - timeline.clock.t_ref) * 1e3,
                                           "host_end_ms": (time.perf_counter() - timeline.clock.t_ref) * 1e3,
                                           "running_free": len(running) - num_det, "running_det": num_det,
                                           "waiting": len(tracker.gen._pool.waiting)})
            return hooked

        def fast_launch(original):
            def hooked(self, plan, prompt_drafts=()):
                if not timeline.is_recording:
                    return original(self, plan, prompt_drafts)
                det = timeline.det
                if det is not None and timeline.step_index % det.every == 0:
                    det.record(self._pool, plan)
                start = timeline.clock.mark()
                try:
                    return original(self, plan, prompt_drafts)
                finally:
                    rows = (len(plan.fast_decode) + sum(c.num_tokens for c in plan.fast_prefill)
                            + sum(c.num_tokens for c in prompt_drafts))
                    timeline.fast.append((timeline.step_index, start, timeline.clock.mark(), rows))
            return hooked

        def pass_run(original):
            def hooked(self, inputs, per_row, targets, start=0):
                if not timeline.is_recording:
                    return original(self, inputs, per_row, targets, start)
                begin = timeline.clock.mark()
                try:
                    return original(self, inputs, per_row, targets, start)
                finally:
                    stream = torch.cuda.current_stream(self.device) if timeline.clock.is_cuda else None
                    priority = stream.priority if stream is not None else 0
                    # a sliced pass's last slice with the head and sampler (its earlier slices: slice_run)
                    timeline.passes.append((timeline.step_index, begin, timeline.clock.mark(), self._bucket,
                                            priority, start if self.num_slices > 1 else None, True))
            return hooked

        def slice_run(original):
            def hooked(self, inputs, start, end):
                if not timeline.is_recording or end == self.num_slices:  # the last: inside _run_with_details
                    return original(self, inputs, start, end)
                begin = timeline.clock.mark()
                try:
                    return original(self, inputs, start, end)
                finally:
                    stream = torch.cuda.current_stream(self.device) if timeline.clock.is_cuda else None
                    priority = stream.priority if stream is not None else 0
                    timeline.passes.append((timeline.step_index, begin, timeline.clock.mark(), self._bucket,
                                            priority, start, False))
            return hooked

        self._patch(runner_module._Tracker, "step", step)
        self._patch(FastStep, "launch", fast_launch)
        self._patch(CanonicalPass, "_run_with_details", pass_run)
        self._patch(CanonicalPass, "_run_slices", slice_run)
        return self

    def __exit__(self, *exc_info) -> None:
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()

    def report(self, *, free_last_finish_s: float | None = None) -> dict:
        """Spans in ms since the run's first timed step, and their summary (``summarize``)."""
        if self.clock.is_cuda:
            torch.cuda.synchronize()
        ms = self.clock.ms
        fast = [{"step": s, "start_ms": ms(a), "end_ms": ms(b), "rows": rows} for s, a, b, rows in self.fast]
        passes = [{"step": s, "start_ms": ms(a), "end_ms": ms(b), "rows": rows, "priority": prio, "slice": k,
                   "final": final} for s, a, b, rows, prio, k, final in self.passes]
        return {"steps": self.steps, "fast": fast, "passes": passes,
                "summary": summarize(self.steps, fast, passes, free_last_finish_s=free_last_finish_s)}


def _union_ms(spans: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Milliseconds of [lo, hi) covered by at least one span."""
    total, end = 0.0, lo
    for a, b in sorted(spans):
        a, b = max(a, end), min(b, hi)
        if b > a:
            total += b - a
            end = b
    return total


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 4) if values else None


ROW_CLASSES = (32, 64, 128, 256, 512)  # a fast step's rows: at most 32, 64, ..., 512, or more


def _by_row_class(fast: list[dict], is_beside: list[bool]) -> dict:
    """Per class of a fast step's rows (``ROW_CLASSES``; "<=N" or ">512"), the median ms of the steps alone and beside a
    pass, their counts and the ratio of the two medians (None where a side has no step); classes with no step left
    out."""
    groups: dict[str, tuple[list[float], list[float]]] = {}
    for f, b in zip(fast, is_beside):
        bound = next((n for n in ROW_CLASSES if f["rows"] <= n), None)
        key = f"<={bound}" if bound is not None else f">{ROW_CLASSES[-1]}"
        groups.setdefault(key, ([], []))[1 if b else 0].append(f["end_ms"] - f["start_ms"])
    order = [f"<={n}" for n in ROW_CLASSES] + [f">{ROW_CLASSES[-1]}"]
    out = {}
    for key in (k for k in order if k in groups):
        alone, beside = groups[key]
        a, b = _median(alone), _median(beside)
        out[key] = {"alone_ms": a, "beside_ms": b, "num_alone": len(alone), "num_beside": len(beside),
                    "beside_over_alone": round(b / a, 3) if a and b else None}
    return out


def summarize(steps: list[dict], fast: list[dict], passes: list[dict], *,
              free_last_finish_s: float | None = None) -> dict:
    """Fast steps alone and beside a pass, passes by rows, the device's busy shares over the run, its tail and bins."""
    pass_spans = [(p["start_ms"], p["end_ms"]) for p in passes]
    fast_spans = [(f["start_ms"], f["end_ms"]) for f in fast]

    def beside(f) -> bool:
        return any(a < f["end_ms"] and f["start_ms"] < b for a, b in pass_spans)

    is_beside = [beside(f) for f in fast]
    end = max([b for _, b in fast_spans + pass_spans] + [s["host_end_ms"] for s in steps], default=0.0)

    def busy(lo: float, hi: float) -> dict:
        span = max(hi - lo, 1e-9)
        return {"fast": round(_union_ms(fast_spans, lo, hi) / span, 4),
                "passes": round(_union_ms(pass_spans, lo, hi) / span, 4),
                "either": round(_union_ms(fast_spans + pass_spans, lo, hi) / span, 4)}

    by_rows: dict[int, list[float]] = {}
    by_slice: dict[int, list[float]] = {}  # a sliced pass's spans by slice (canonical_slices)
    for p in passes:
        if p.get("slice") is None:
            by_rows.setdefault(p["rows"], []).append(p["end_ms"] - p["start_ms"])
        else:
            by_slice.setdefault(p["slice"], []).append(p["end_ms"] - p["start_ms"])
    bins = []
    for i in range(int(end // BIN_MS) + 1):
        lo, hi = i * BIN_MS, min((i + 1) * BIN_MS, end)
        if hi <= lo:
            break
        last = [s for s in steps if s["host_end_ms"] <= hi]
        mix = last[-1] if last else {"running_free": 0, "running_det": 0}
        bins.append({"start_ms": lo, **busy(lo, hi), "running_free": mix["running_free"],
                     "running_det": mix["running_det"]})
    summary = {
        "num_steps": len(steps), "num_fast_steps": len(fast),
        "num_passes": sum(1 for p in passes if p.get("final", True)), "run_ms": round(end, 3),
        "fast_ms_p50": _median([f["end_ms"] - f["start_ms"] for f in fast]),
        "fast_ms_p50_alone": _median([f["end_ms"] - f["start_ms"] for f, b in zip(fast, is_beside) if not b]),
        "fast_ms_p50_beside_a_pass": _median([f["end_ms"] - f["start_ms"] for f, b in zip(fast, is_beside) if b]),
        "fast_steps_beside_a_pass": sum(is_beside),
        # a fast step's rows alone and beside a pass: whether the steps beside a pass are longer for their rows
        "fast_rows_p50_alone": _median([f["rows"] for f, b in zip(fast, is_beside) if not b]),
        "fast_rows_p50_beside_a_pass": _median([f["rows"] for f, b in zip(fast, is_beside) if b]),
        "fast_us_per_row_p50_alone": _median([1e3 * (f["end_ms"] - f["start_ms"]) / f["rows"]
                                              for f, b in zip(fast, is_beside) if not b and f["rows"]]),
        "fast_us_per_row_p50_beside_a_pass": _median([1e3 * (f["end_ms"] - f["start_ms"]) / f["rows"]
                                                      for f, b in zip(fast, is_beside) if b and f["rows"]]),
        # the same rows alone and beside a pass (round 38: the steps beside a pass had twice the rows at the median,
        # so the medians above mix "bigger" with "slower"): per class of rows, each side's median ms and count
        "fast_ms_p50_by_rows": _by_row_class(fast, is_beside),
        "pass_ms_p50_by_rows": {str(rows): _median(v) for rows, v in sorted(by_rows.items())},
        "slice_ms_p50": {str(k): _median(v) for k, v in sorted(by_slice.items())},
        "passes_at_raised_priority": sum(p["priority"] < 0 for p in passes),
        "busy": busy(0.0, end), "bins": bins,
    }
    if free_last_finish_s is not None:  # the tail: only deterministic requests left
        lo = free_last_finish_s * 1e3
        summary["tail"] = {"start_ms": round(lo, 3), "ms": round(max(end - lo, 0.0), 3), **busy(lo, end)}
    return summary


def plot(runs: dict, path: Path) -> None:
    """One panel per run: the busy shares per bin and the running requests."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 2.6 * len(runs)), squeeze=False)
    for ax, (name, run) in zip(axes[:, 0], runs.items()):
        bins = run["summary"]["bins"]
        t = [b["start_ms"] / 1e3 for b in bins]
        for key in ("fast", "passes", "either"):
            ax.plot(t, [b[key] for b in bins], label=f"busy: {key}")
        ax.set_ylim(0, 1.05)
        ax.set_title(name, fontsize=9)
        twin = ax.twinx()
        twin.plot(t, [b["running_free"] for b in bins], "k:", label="running free")
        twin.plot(t, [b["running_det"] for b in bins], "k--", label="running det.")
        if "tail" in run["summary"]:
            ax.axvline(run["summary"]["tail"]["start_ms"] / 1e3, color="grey", lw=0.8)
        ax.legend(loc="upper left", fontsize=7)
        twin.legend(loc="upper right", fontsize=7)
    axes[-1, 0].set_xlabel("s since the first step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    dvr_ab.add_setup_arguments(p)
    p.add_argument("--out", required=True)
    p.add_argument("--variants", default="default")
    p.add_argument("--modes", default="nondet,dvr@50")
    p.add_argument("--png", default=None)
    p.add_argument("--keep-spans", action="store_true", help="keep every span in the JSON (default: summaries)")
    p.add_argument("--det-progress", type=int, default=0, metavar="K",
                   help="every K-th step, count what each deterministic request does (DetProgress; 0: off)")
    p.add_argument("--online-load", type=float, default=None, metavar="L",
                   help="serve online instead: the first --online-requests requests arriving as a Poisson process "
                        "at L x the first variant's offline nondet capacity (measured first, untraced), as dvr_ab.py")
    p.add_argument("--online-requests", type=int, default=500)
    args = p.parse_args(argv)
    if not args.model:
        p.error("--model is required")
    variants = [v for v in args.variants.split(",") if v]
    modes = [m for m in args.modes.split(",") if m]
    config, model, workload, det_order, engines = dvr_ab.setup(args, variants)
    dvr_ab.warm_up(args, engines, workload, config, warm_modes=",".join(modes), tag="dvr_timeline")
    share = args.budget_s / (len(modes) * len(variants))
    is_cuda = model.weights.device.type == "cuda"
    out: dict = {"model": model.summary(), "device": dvr_ab.device_name(), "host_probe": host_probe(),
                 "torch": torch.__version__,
                 "args": {k: str(v) for k, v in vars(args).items()}, "workload": workload.summary(), "runs": {}}
    arrivals = None
    if args.online_load is not None:  # the capacity, as dvr_ab.py measures it: the first variant's offline nondet
        capacity_run = run_offline(engines[variants[0]], workload, mode_by_name("nondet"), det_order=det_order,
                                   deadline=time.perf_counter() + share + dvr_ab.BUILD_ALLOWANCE_S, budget_s=share)
        capacity = workload.num_requests / capacity_run.elapsed_s
        workload = workload.head(min(args.online_requests, workload.num_requests))
        arrivals = poisson_arrivals(workload.num_requests, args.online_load * capacity, seed=config.seed)
        out["online"] = {"load": args.online_load, "capacity_rps": capacity, "rate_rps": args.online_load * capacity,
                         "num_requests": workload.num_requests, "capacity_run_complete": capacity_run.is_complete}
        print(f"[dvr_timeline] online at {args.online_load} x {capacity:.1f} req/s, {workload.num_requests} requests",
              flush=True)
    for v in variants:
        for mode_name in modes:
            print(f"[dvr_timeline] {v} {mode_name}", flush=True)
            with Timeline(is_cuda, det_every=args.det_progress) as timeline:
                deadline = time.perf_counter() + share + dvr_ab.BUILD_ALLOWANCE_S
                if arrivals is None:
                    result = run_offline(engines[v], workload, mode_by_name(mode_name), det_order=det_order,
                                         deadline=deadline, budget_s=share)
                else:
                    result = run_online(engines[v], workload, mode_by_name(mode_name), arrivals,
                                        det_order=det_order, deadline=deadline, budget_s=share)
            tail = dvr_ab.tail_summary(result, workload)
            report = timeline.report(free_last_finish_s=tail["free"]["last_finish_s"] if mode_name != "nondet"
                                     else None)
            if not args.keep_spans:
                report = {"summary": report["summary"]}
            report.update(is_complete=result.is_complete, elapsed_s=result.elapsed_s,
                          output_tokens_per_s=result.tokens_per_s,
                          free_last_finish_s=tail["free"]["last_finish_s"],
                          deterministic_last_finish_s=tail["deterministic"]["last_finish_s"], notes=list(result.notes))
            for note in result.notes:  # a run that deviated from the plan (e.g. eager after a failed graph capture)
                print(f"[dvr_timeline]   note: {note}", flush=True)
            if timeline.det is not None and timeline.records is not None and mode_name != "nondet":
                records = timeline.records  # engine request id -> the workload request's record
                committed = {rid: rec.num_tokens for rid, rec in records.items() if rec.is_deterministic}
                rid_of = {rec.index: rid for rid, rec in records.items()}
                last = [rid_of[f["index"]] for f in tail["last_finishers"] if f["deterministic"]]
                report["det_progress"] = timeline.det.summary(committed, last)
                for entry in report["det_progress"]["last_finishers"]:
                    entry["index"] = records[entry["rid"]].index
                print(f"[dvr_timeline]   det progress {report['det_progress']['shares']}, steps per token "
                      f"{report['det_progress']['steps_per_token']}", flush=True)
            out["runs"][f"{v} {mode_name}"] = report
            s = report["summary"]
            print(f"[dvr_timeline]   {s['num_steps']} steps, {s['num_passes']} passes; fast ms p50 alone "
                  f"{s['fast_ms_p50_alone']} beside a pass {s['fast_ms_p50_beside_a_pass']} (rows "
                  f"{s['fast_rows_p50_alone']} / {s['fast_rows_p50_beside_a_pass']}, us per row "
                  f"{s['fast_us_per_row_p50_alone']} / {s['fast_us_per_row_p50_beside_a_pass']}); busy "
                  f"{s['busy']}; tail {s.get('tail')}", flush=True)
            by_rows = {k: (v["alone_ms"], v["beside_ms"], v["num_alone"], v["num_beside"], v["beside_over_alone"])
                       for k, v in s["fast_ms_p50_by_rows"].items()}
            print(f"[dvr_timeline]   fast ms by rows (alone, beside a pass, their counts, ratio) {by_rows}", flush=True)
            Path(args.out).write_text(json.dumps(out, indent=1))
    if args.png:
        plot(out["runs"], Path(args.png))
    return out


if __name__ == "__main__":
    main()
