"""What one benchmark run measured, and the numbers reported from it.

Reported per run (``summarize``): output tokens per second, rollbacks per
request, recomputed tokens as a share of committed ones, TTFT, inter-token
(ITL), time-per-output-token (TPOT) and end-to-end latency percentiles
(p50/p90/p99), and — when a ``nondet`` run of the same request set is given —
the throughput ratio to it and the latency of this run's non-deterministic
requests relative to the same requests there.

Every time is the host clock when ``step()`` returned the tokens (what a
client of the engine sees). ITL is the gap between two successive steps that
delivered tokens to one request: a deterministic request's tokens arrive in
bursts (a canonical pass commits several at once), so its ITL values are the
gaps between bursts and its TPOT is the fairer per-token figure.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from dataclasses import dataclass, field
from typing import NamedTuple

PERCENTILES = (50, 90, 99)


class StepRecord(NamedTuple):
    """One engine step of a run: when ``step()`` was called and returned (seconds from the run's start, the clock
    of ``RequestRecord.delivery_s``), the canonical passes it launched (``stats["canonical_passes"]``) and the
    deterministic requests it delivered committed tokens to (a pass's commits arrive in the step that applies it),
    the time Python's cyclic garbage collector ran inside it (``gc_s``; ``gc.callbacks``), in online runs the
    seconds of each engine phase (``phases``: ``llm42.bench.runner.PHASES``; None where not timed), the rows
    the passes it launched run, padding included (``canonical_rows``: ``stats["canonical_rows"]``), the fast
    path's tokens it read back (``fast_tokens``: ``stats["fast_tokens"]``, free tokens and drafts: the rows of the
    fast step it read) and whether a canonical pass was still running on the device when it began
    (``pass_in_flight``: launched in an earlier step and not finished; rounds 39 and 43 saw the gaps beside no pass
    launched nearby at 1.08-1.10x nondet's, and a pass launched earlier may still run beside them)."""

    start_s: float
    end_s: float
    passes_launched: int
    deterministic_delivered: int
    gc_s: float = 0.0
    phases: dict | None = None
    canonical_rows: int = 0
    fast_tokens: int = 0
    pass_in_flight: bool = False


@dataclass
class RequestRecord:
    """One request in one run; times are seconds from the run's start."""

    index: int
    is_deterministic: bool
    arrival_s: float
    first_token_s: float | None = None
    finish_s: float | None = None
    num_tokens: int = 0
    token_ids: list[int] = field(default_factory=list)
    num_rollbacks: int = 0
    num_recomputed: int = 0
    # when each hand-over of tokens happened: mid-step where the generator hands tokens over before its canonical
    # phase (``DVRGenerator.step(deliver=...)``), else when the step returned
    delivery_s: list[float] = field(default_factory=list)
    delivery_step: list[int] = field(default_factory=list)  # each hand-over's step (an index into RunResult.steps)
    returned_s: list[float] = field(default_factory=list)  # when each hand-over's step returned

    @property
    def is_finished(self) -> bool:
        return self.finish_s is not None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> float | None:
        return None if self.finish_s is None else self.finish_s - self.arrival_s

    @property
    def itl_s(self) -> list[float]:
        """Gaps between successive deliveries (one value per delivery after the first)."""
        times = self.delivery_s
        return [b - a for a, b in zip(times, times[1:])]

    @property
    def itl_at_return_s(self) -> list[float]:
        """``itl_s`` as a caller sees it that takes tokens only when ``step()`` returns: gaps between the returns of
        successive steps that delivered tokens (the clock before ``step(deliver=...)``; one per such step)."""
        times = sorted(set(self.returned_s))
        return [b - a for a, b in zip(times, times[1:])]

    @property
    def tpot_s(self) -> float | None:
        """(finish - first token) / (tokens - 1): the mean time per output token after the first."""
        if self.finish_s is None or self.first_token_s is None or self.num_tokens < 2:
            return None
        return (self.finish_s - self.first_token_s) / (self.num_tokens - 1)


@dataclass
class RunResult:
    mode: str
    records: list[RequestRecord]
    elapsed_s: float  # host wall clock, device synchronized at both ends
    device_elapsed_s: float | None  # CUDA events around the same region (None off CUDA)
    stats: dict[str, int]  # the generator's stats for this run (warm-up excluded)
    is_complete: bool  # False when the time budget cut the run short
    notes: list[str] = field(default_factory=list)  # how the run deviated from the plan, if it did
    # one StepRecord per engine step of the timed run, in order (``free_gap_attribution``)
    steps: list[StepRecord] = field(default_factory=list)

    @property
    def num_output_tokens(self) -> int:
        return sum(r.num_tokens for r in self.records)

    @property
    def tokens_per_s(self) -> float:
        return self.num_output_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolation percentile (numpy's default); None for no values."""
    if not values:
        return None
    return _sorted_percentile(sorted(values), q)


def percentiles(values: list[float]) -> dict[str, float | None]:
    ordered = sorted(values)
    out: dict[str, float | None] = {f"p{q}": _sorted_percentile(ordered, q) if ordered else None
                                    for q in PERCENTILES}
    out["mean"] = sum(values) / len(values) if values else None
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def _latencies(records: list[RequestRecord]) -> dict:
    return {
        "ttft_s": percentiles([r.ttft_s for r in records if r.ttft_s is not None]),
        "itl_s": percentiles([gap for r in records for gap in r.itl_s]),
        "itl_at_return_s": percentiles([gap for r in records for gap in r.itl_at_return_s]),
        "tpot_s": percentiles([r.tpot_s for r in records if r.tpot_s is not None]),
        "e2e_s": percentiles([r.e2e_s for r in records if r.e2e_s is not None]),
    }


CDF_POINTS = tuple(i / 2 for i in range(201))  # percentiles 0, 0.5, ..., 100


def cdf(values: list[float]) -> dict | None:
    """A compact CDF: the value at every half percentile (201 numbers, whatever the sample size)."""
    if not values:
        return None
    ordered = sorted(values)
    return {"num_values": len(ordered), "percentiles": list(CDF_POINTS),
            "values": [round(_sorted_percentile(ordered, q), 7) for q in CDF_POINTS]}


def _sorted_percentile(ordered: list[float], q: float) -> float:
    pos = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def output_digest(records: list[RequestRecord]) -> str:
    """sha256 over (index, token ids) of the given requests, in index order: equal digests = equal outputs."""
    h = hashlib.sha256()
    for r in sorted(records, key=lambda r: r.index):
        h.update(f"{r.index}:{','.join(map(str, r.token_ids))};".encode())
    return h.hexdigest()[:16]


def nondet_latency_vs(run: RunResult, nondet: RunResult) -> dict:
    """This run's non-deterministic requests against the same requests in the ``nondet`` run."""
    base = {r.index: r for r in nondet.records if r.is_finished}
    pairs = [(r, base[r.index]) for r in run.records if not r.is_deterministic and r.is_finished and r.index in base]
    mine = [r.e2e_s for r, _ in pairs]
    theirs = [b.e2e_s for _, b in pairs]
    mine_ttft = [r.ttft_s for r, _ in pairs]
    theirs_ttft = [b.ttft_s for _, b in pairs]
    return {
        "num_requests": len(pairs),
        "e2e_p50_ratio": _ratio(percentile(mine, 50), percentile(theirs, 50)),
        "e2e_p90_ratio": _ratio(percentile(mine, 90), percentile(theirs, 90)),
        "e2e_mean_ratio": _ratio(sum(mine) / len(mine) if mine else None,
                                 sum(theirs) / len(theirs) if theirs else None),
        "ttft_p50_ratio": _ratio(percentile(mine_ttft, 50), percentile(theirs_ttft, 50)),
    }


def determinism_check(run: RunResult, reference: dict[int, list[int]]) -> dict:
    """Deterministic requests of ``run`` against the reference outputs (request index -> token ids)."""
    checked = [r for r in run.records if r.is_deterministic and r.is_finished and r.index in reference]
    mismatched = [r.index for r in checked if r.token_ids != reference[r.index]]
    return {"num_checked": len(checked), "num_identical": len(checked) - len(mismatched),
            "mismatched_requests": mismatched}


def summarize(run: RunResult, *, nondet: RunResult | None = None,
              reference: dict[int, list[int]] | None = None, keep_latencies: bool = False) -> dict:
    """The reported numbers of one run (JSON-ready)."""
    records = run.records
    det = [r for r in records if r.is_deterministic]
    det_tokens = sum(r.num_tokens for r in det)
    num_committed = run.num_output_tokens
    num_recomputed = sum(r.num_recomputed for r in records)
    stats = run.stats
    out = {
        "mode": run.mode,
        "is_complete": run.is_complete,
        "num_requests": len(records),
        "num_finished": sum(r.is_finished for r in records),
        "num_deterministic": len(det),
        "deterministic_share": len(det) / len(records) if records else 0.0,
        "output_tokens": num_committed,
        "elapsed_s": run.elapsed_s,
        "device_elapsed_s": run.device_elapsed_s,
        "output_tokens_per_s": run.tokens_per_s,
        "ratio_to_nondet": _ratio(run.tokens_per_s, nondet.tokens_per_s) if nondet is not None else None,
        "rollbacks_per_request": sum(r.num_rollbacks for r in records) / len(records) if records else 0.0,
        "rollbacks_per_deterministic_request": sum(r.num_rollbacks for r in det) / len(det) if det else None,
        "recomputed_tokens": num_recomputed,
        "recompute_share": num_recomputed / num_committed if num_committed else 0.0,
        "recompute_share_deterministic": (sum(r.num_recomputed for r in det) / det_tokens) if det_tokens else None,
        "engine": {
            "fast_steps": stats.get("fast_steps", 0),
            "canonical_passes": stats.get("canonical_passes", 0),
            "canonical_row_utilization": _ratio(stats.get("canonical_rows_used", 0), stats.get("canonical_rows", 0)),
            "canonical_rows_used": stats.get("canonical_rows_used", 0),
            "ahead_tokens_kept": stats.get("ahead_tokens_kept", 0),
            "ahead_tokens_dropped": stats.get("ahead_tokens_dropped", 0),
        },
        "latency": _latencies(records),
        "latency_deterministic": _latencies(det),
        "latency_nondeterministic": _latencies([r for r in records if not r.is_deterministic]),
        "output_digest": output_digest(records),
    }
    if nondet is not None and run is not nondet and any(not r.is_deterministic for r in records):
        out["nondet_requests_vs_nondet_run"] = nondet_latency_vs(run, nondet)
    if reference is not None and det:
        out["determinism"] = determinism_check(run, reference)
    if run.notes:
        out["notes"] = list(run.notes)
    if keep_latencies:
        out["e2e_s_values"] = [round(r.e2e_s, 6) for r in records if r.e2e_s is not None]
        out["ttft_s_values"] = [round(r.ttft_s, 6) for r in records if r.ttft_s is not None]
    return out


GAP_KINDS = ("neither", "launch", "apply", "launch_and_apply")
# the widest pass a gap's fast steps could have run beside (canonical rows, padding included): none, an R-row pass
# of CUDA's default config or narrower, up to 1,024 rows, wider (round 36: on the device a decode step takes
# +0.4 ms beside a pass of up to 256 rows, +0.9-1.0 ms beside a 2,048-row one)
PASS_WIDTHS = ("no_pass", "rows_le_256", "rows_le_1024", "rows_gt_1024")
# whether a canonical pass could have run on the device beside a gap's fast steps (``free_gap_attribution``)
RUNNING = ("none_running", "running")
# the fast tokens of a gap's delivering step, binned (``free_gap_attribution``'s ``running_by_rows``): upper edges;
# round 45's SmolLM2 gaps at 0.7 load carried 50-110 on average, and a gap's p50 tracked them in every class
FAST_TOKEN_EDGES = (32, 64, 96, 128, 192)
FAST_TOKEN_BINS = tuple(f"le_{e}" for e in FAST_TOKEN_EDGES) + (f"gt_{FAST_TOKEN_EDGES[-1]}",)
# ``running_at_equal_rows`` compares a bin only where each class has at least this many gaps (a p50 of a handful of
# gaps is noise; round 46's SmolLM2 dvr@50 runs online had 2,000-33,000 per class in the bins it compared)
MIN_BIN_GAPS = 20


def _fast_token_bin(tokens: int) -> str:
    return FAST_TOKEN_BINS[bisect.bisect_left(FAST_TOKEN_EDGES, tokens)]


def _pass_width(rows: int) -> str:
    return PASS_WIDTHS[0 if rows == 0 else 1 if rows <= 256 else 2 if rows <= 1024 else 3]


def _gap_kind(launched: bool, applied: bool) -> str:
    return GAP_KINDS[launched + 2 * applied]


# where a step's pass work fell against its read-back of the fast step (``StepRecord.phases`` keeps the phases in the
# order each first ran): steps whose first apply came after the read (a pass found ready only in the canonical phase,
# where the launch follows it: both in the next free gap with ``step(deliver=...)``), and whose first launch came
# before it (``pass_before_read``)
PHASE_ORDERS = ("apply_after_read", "launch_before_read")


def _phase_orders(phases: dict | None) -> dict[str, bool]:
    """``PHASE_ORDERS`` of one step's timed phases (all False where the step has no such phase, or none timed)."""
    names = list(phases or ())
    read = names.index("fast_read") if "fast_read" in names else None
    return {"apply_after_read": read is not None and "apply" in names and names.index("apply") > read,
            "launch_before_read": read is not None and "launch" in names and names.index("launch") < read}


def free_gap_attribution(run: RunResult, *, min_bin_gaps: int = MIN_BIN_GAPS) -> dict:
    """Where free requests' inter-token gaps come from, from ``run.steps``.

    Each gap (two successive deliveries to one free request) spans the steps after the first delivery up to the
    step that made the second (and the first delivery's own step where it came mid-step, ``RequestRecord``); it is
    of kind ``"launch"`` if one of those steps launched a canonical pass, ``"apply"`` if one delivered a pass's
    commits to deterministic requests, ``"launch_and_apply"`` if both, ``"neither"`` otherwise (``GAP_KINDS``).
    Reported per kind: the share of gaps and their p50 / p90 / p99 (ms); the kinds' shares among the slowest 1 % of
    gaps; and the steps themselves (count, p50 / p99 / mean ms of ``step()``'s wall time, the mean ms of each
    engine phase where the steps were timed: ``StepRecord.phases``, and how many of them applied a pass after the
    read-back or launched one before it: ``phase_order``, ``PHASE_ORDERS``) by the same kinds.
    What it separates: gaps a pass's device work or host work lengthens from those of plain steps (``dvr_ab.py``
    online, the free ITL target). ``gc``: the collector's share, whatever the kind: the steps it ran in, its total
    and largest time in a step, and the share of gaps (of all, and of the slowest 1 %) that span a step it ran in
    (a run served outside ``frozen_gc`` makes full collections of every object).
    ``beside``: the gaps again by the widest pass their fast steps could have run beside (``PASS_WIDTHS``: the
    widest launched from the step before the gap's first delivery up to the step of its second; a fast step read
    in a step was launched in the one before), the share and p50 / p99 of each class and each class's share of the
    slowest 1 %: whether the slow gaps sit beside wide passes.
    ``running``: the gaps again by whether a canonical pass could have been running on the device beside them at all
    (``RUNNING``: one was in flight at the start of, or launched in, a step from the one before the gap's first
    delivery up to that of its second, ``StepRecord.pass_in_flight``: what ``beside`` misses, a pass launched earlier
    and still running), each class's share, p50 / p99 and share of the slowest 1 %, and the mean fast tokens read
    in the steps that made its second deliveries (``mean_fast_tokens``: how many rows the fast steps of those gaps
    carried, ``StepRecord.fast_tokens``). ``fast_tokens``: the run's mean per step and per gap (the second
    delivery's step): whether a mode's fast steps carry more rows than another's. ``running_by_rows``: each
    ``running`` class again by its gaps' delivering-step fast tokens (``FAST_TOKEN_BINS``), the share of all gaps
    and the p50 / p99 of each (class, bin): at the same rows, whether a gap beside a pass is longer than one beside
    none (a pass's share of the device) or only carries more rows (more requests decoding); ``beside_by_rows``: the
    ``beside`` classes (the widest pass launched nearby) by the same bins. ``running_at_equal_rows``: the answer
    in one number, ``running_by_rows``'s p50 beside a pass over its p50 beside none in each bin where both classes
    have ``min_bin_gaps`` gaps or more (``bins``), their mean weighted by the running gaps in each (``weighted``;
    None where no bin qualifies) and the share of the running gaps those bins hold (``running_share_compared``):
    round 46 measured 1.16-1.26 per bin on SmolLM2 at dvr@50, where a pass that only brought rows gives 1.0."""
    if min_bin_gaps < 1:
        raise ValueError(f"min_bin_gaps must be at least 1, got {min_bin_gaps}")
    steps = run.steps
    index_of = {s.end_s: i for i, s in enumerate(steps)}  # records without step indices: by their return times
    gaps: dict[str, list[float]] = {k: [] for k in GAP_KINDS}
    beside: dict[str, list[tuple[float, int]]] = {k: [] for k in PASS_WIDTHS}  # (gap, its delivering step's tokens)
    running: dict[str, list[tuple[float, int]]] = {k: [] for k in RUNNING}  # (gap, its delivering step's tokens)
    every: list[tuple[float, str, bool, str, str]] = []
    unmatched = 0
    for rec in run.records:
        if rec.is_deterministic:
            continue
        previous = previous_t = None
        by_step = rec.delivery_step if len(rec.delivery_step) == len(rec.delivery_s) else None
        for k, t in enumerate(rec.delivery_s):
            i = by_step[k] if by_step is not None else index_of.get(t)
            if i is None or not 0 <= i < len(steps):
                unmatched += 1
                continue
            if previous is not None:
                # a first delivery mid-step (``step(deliver=...)``, before that step's canonical phase): the gap
                # also spans what that step did after it
                spanned = steps[previous + (previous_t >= steps[previous].end_s): i + 1]
                kind = _gap_kind(any(s.passes_launched for s in spanned),
                                 any(s.deterministic_delivered for s in spanned))
                gap = t - previous_t
                gaps[kind].append(gap)
                near = steps[max(previous - 1, 0): i + 1]
                width = _pass_width(max(s.canonical_rows for s in near))
                beside[width].append((gap, steps[i].fast_tokens))
                run_class = RUNNING[any(s.pass_in_flight or s.passes_launched for s in near)]
                running[run_class].append((gap, steps[i].fast_tokens))
                every.append((gap, kind, any(s.gc_s > 0 for s in spanned), width, run_class))
            previous, previous_t = i, t
    every.sort(reverse=True)
    slowest = every[: max(1, len(every) // 100)] if every else []
    by_step: dict[str, list[float]] = {k: [] for k in GAP_KINDS}
    phases: dict[str, dict[str, float]] = {k: {} for k in GAP_KINDS}  # per kind: phase -> total seconds
    order: dict[str, dict[str, int]] = {k: dict.fromkeys(PHASE_ORDERS, 0) for k in GAP_KINDS}
    for s in steps:
        kind = _gap_kind(s.passes_launched > 0, s.deterministic_delivered > 0)
        by_step[kind].append(s.end_s - s.start_s)
        for name, seconds in (s.phases or {}).items():
            phases[kind][name] = phases[kind].get(name, 0.0) + seconds
        for name, is_after in _phase_orders(s.phases).items():
            order[kind][name] += is_after

    running_binned = _binned(running)

    def ms(values: list[float], q: int) -> float | None:
        value = percentile(values, q)
        return None if value is None else round(value * 1e3, 4)

    return {
        "num_gaps": len(every), "unmatched_deliveries": unmatched,
        "gaps": {k: {"share": len(v) / len(every) if every else None, "p50_ms": ms(v, 50), "p90_ms": ms(v, 90),
                     "p99_ms": ms(v, 99)} for k, v in gaps.items()},
        "slowest_1pct_share": {k: sum(1 for _, kind, *_ in slowest if kind == k) / len(slowest) if slowest else None
                               for k in GAP_KINDS},
        "steps": {k: {"count": len(v), "p50_ms": ms(v, 50), "p99_ms": ms(v, 99), "mean_ms": round(
            1e3 * sum(v) / len(v), 4) if v else None, "phases_mean_ms": {name: round(1e3 * total / len(v), 4)
                                                                          for name, total in phases[k].items()},
                      "phase_order": order[k]}
                  for k, v in by_step.items()},
        "gc": {"steps": sum(1 for s in steps if s.gc_s > 0), "total_ms": round(sum(s.gc_s for s in steps) * 1e3, 4),
               "max_step_ms": round(max((s.gc_s for s in steps), default=0.0) * 1e3, 4),
               "gap_share": sum(1 for _, _, g, *_ in every if g) / len(every) if every else None,
               "slowest_1pct_share": sum(1 for _, _, g, *_ in slowest if g) / len(slowest) if slowest else None},
        "beside": {"gaps": {k: {"share": len(v) / len(every) if every else None, "p50_ms": ms([g for g, _ in v], 50),
                                "p99_ms": ms([g for g, _ in v], 99)} for k, v in beside.items()},
                   "slowest_1pct_share": {k: sum(1 for *_, w, _ in slowest if w == k) / len(slowest) if slowest
                                          else None for k in PASS_WIDTHS}},
        "running": {"gaps": {k: {"share": len(v) / len(every) if every else None,
                                 "p50_ms": ms([g for g, _ in v], 50), "p99_ms": ms([g for g, _ in v], 99),
                                 "mean_fast_tokens": _mean([n for _, n in v])} for k, v in running.items()},
                    "slowest_1pct_share": {k: sum(1 for *_, r in slowest if r == k) / len(slowest) if slowest
                                           else None for k in RUNNING}},
        "running_by_rows": _by_rows(running_binned, len(every), ms),
        "beside_by_rows": _by_rows(_binned(beside), len(every), ms),
        "running_at_equal_rows": _at_equal_rows(running_binned, min_bin_gaps),
        "fast_tokens": {"per_step_mean": _mean([s.fast_tokens for s in steps]),
                        "per_gap_mean": _mean([n for v in running.values() for _, n in v])},
    }


def _binned(classes: dict[str, list[tuple[float, int]]]) -> dict[str, dict[str, list[float]]]:
    """Each class's (gap, delivering-step fast tokens) pairs as gaps by ``FAST_TOKEN_BINS`` (each gap binned once)."""
    out: dict[str, dict[str, list[float]]] = {}
    for k, v in classes.items():
        bins = out[k] = {}
        for gap, n in v:
            bins.setdefault(_fast_token_bin(n), []).append(gap)
    return out


def _by_rows(binned: dict[str, dict[str, list[float]]], num_gaps: int, ms) -> dict:
    """``_binned`` classes: the share of all ``num_gaps`` and the p50 / p99 (``ms``) of every non-empty (class, bin)."""
    return {k: {b: {"share": len(bins[b]) / num_gaps, "p50_ms": ms(bins[b], 50), "p99_ms": ms(bins[b], 99)}
                for b in FAST_TOKEN_BINS if b in bins}
            for k, bins in binned.items()}


def _at_equal_rows(binned: dict[str, dict[str, list[float]]], min_bin_gaps: int) -> dict:
    """``free_gap_attribution``'s ``running_at_equal_rows`` from the ``_binned`` running classes: per fast-token bin,
    the running class's p50 over the none-running class's, where each has ``min_bin_gaps`` gaps; their mean weighted
    by the running gaps."""
    bins, weights = {}, {}
    for b in FAST_TOKEN_BINS:
        beside_pass, beside_none = binned["running"].get(b, []), binned["none_running"].get(b, [])
        if len(beside_pass) < min_bin_gaps or len(beside_none) < min_bin_gaps:
            continue
        none_p50 = percentile(beside_none, 50)
        if not none_p50:
            continue
        bins[b] = round(percentile(beside_pass, 50) / none_p50, 4)
        weights[b] = len(beside_pass)
    compared, num_running = sum(weights.values()), sum(len(v) for v in binned["running"].values())
    return {"bins": bins,
            "weighted": round(sum(bins[b] * weights[b] for b in bins) / compared, 4) if compared else None,
            "running_share_compared": compared / num_running if num_running else None,
            "min_bin_gaps": min_bin_gaps}


def _mean(values: list[int]) -> float | None:
    return round(sum(values) / len(values), 3) if values else None
