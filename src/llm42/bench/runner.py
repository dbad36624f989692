"""One benchmark run: a mode serving a workload offline (all at once) or online (Poisson arrivals).

Each run gets a fresh generator (so a fresh K/V store: no prefix-cache reuse
between modes) over the same weights. Before its clock starts, the run
captures every decode-graph bucket (CUDA) and serves a few short warm-up
requests (deterministic ones too when the mode verifies), so the generator's
one-time work — first launches, kernel compilation, graph capture — stays out
of the measurement; the warm-up's engine stats are subtracted.

Timing: the device is drained once when the clock starts and once when it
stops; in between, every reading is the bare host clock at the moment
``step()`` returned. The engine overlaps host and device (it reads a step's
tokens back one step later), so a synchronisation per reading would serialise
the two and measure a different engine. CUDA events around the same region are
recorded too. A run past its deadline stops between steps and is marked incomplete.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from llm42.bench.metrics import RequestRecord, RunResult, StepRecord
from llm42.bench.models import BenchModel
from llm42.bench.modes import BATCH_INVARIANT, Mode, deterministic_indices, sampling_params
from llm42.bench.workloads import FIRST_TOKEN_ID, Workload
from llm42.gc_freeze import frozen_gc
from llm42.generator import DVRGenerator, takes_deliver
from llm42.params import SamplingParams
from llm42.policies import BatchInvariantPolicy, FixedShapePolicy, ReductionPolicy
from llm42.scheduler import DEFAULT_ORDER, DefaultScheduler

WARMUP_PROMPT = (FIRST_TOKEN_ID, FIRST_TOKEN_ID + 1)
WARMUP_NEW_TOKENS = 3
WARMUP_KV_TOKENS = 64  # K/V positions the warm-up requests need on top of a workload's


class Clock:
    """Host time; the device is drained only by ``start`` and ``stop``, never by ``now``."""

    def __init__(self, device: torch.device):
        self.device = device
        self.is_cuda = device.type == "cuda"

    def now(self) -> float:
        return time.perf_counter()

    def drain(self) -> None:
        if self.is_cuda:
            torch.cuda.synchronize(self.device)

    def start(self) -> float:
        """Drain the device, then read the clock: the region starts with nothing in flight."""
        self.drain()
        return time.perf_counter()

    def stop(self) -> float:
        """Drain the device, then read the clock: the region ends once all launched work is done."""
        self.drain()
        return time.perf_counter()

    def start_event(self):
        if not self.is_cuda:
            return None
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def elapsed_since(self, start_event) -> float | None:
        if start_event is None:
            return None
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        end.synchronize()
        return start_event.elapsed_time(end) / 1000.0


@dataclass(frozen=True)
class Engine:
    """What every run's generator shares: the model, canonical config, K/V size and batch limit.

    ``max_num_seqs`` also bounds the CUDA-graph decode buckets a generator
    captures, so it is set to the largest workload rather than left at the
    engine's default. ``fast_policy`` replaces the default fast path of the
    non-batch-invariant modes (tests inject ``NoisyFastPolicy`` to force rollbacks).
    ``max_fast_tokens``: token rows per fast step (``DVRGenerator``'s knob).
    """

    model: BenchModel
    window: int
    group: int
    kv_cache_tokens: int
    max_num_seqs: int = 256
    use_cuda_graphs: bool = True
    fast_policy: ReductionPolicy | None = None
    max_fast_tokens: int = 512
    canonical_attention: str = "tiled"  # FixedShapePolicy(attention_kernel=...): the canonical pass's attention
    canonical_gemm: str = "cublas"  # FixedShapePolicy(gemm=...): the canonical pass's GEMM on CUDA
    canonical_tile_m: int = 64  # FixedShapePolicy(tile_m=...): the tiled canonical attention's tile height
    canonical_gemm_rows: int | None = None  # FixedShapePolicy(gemm_rows=...): every canonical GEMM at that M (CUDA)
    max_canonical_tokens: int | None = None  # DVRGenerator's knob (None: its default)
    canonical_stream: bool | None = None  # DVRGenerator's knob: the canonical pass on its own CUDA stream
    draft_ahead: bool = True  # DVRGenerator's knob: deterministic requests draft ahead of windows in a pass
    wide_verify: bool | None = None  # DVRGenerator's knob: verify windows fill passes of more than R rows
    adaptive_draft: bool = False  # DVRGenerator's knob: halve/double a deterministic request's window depth
    prompt_share: float = 0.0  # DefaultScheduler's knob: a pass's rows windows leave to deterministic prompts
    prioritize_fast: bool = False  # DVRGenerator's knob: each step's work on a high-priority CUDA stream
    canonical_priority: str = "low"  # DVRGenerator's knob: the canonical pass's stream priority against the steps'
    canonical_gemm_streams: int = 1  # DVRGenerator's knob: a wide pass's R-row GEMM blocks side by side
    graph_bucket_step: int | None = None  # DVRGenerator's knob: the fast path's graph row ladder (None: the model's)
    chain_passes: str = "prompts"  # DVRGenerator's knob: which canonical passes go behind a pass in flight
    eager_verify: bool = False  # DefaultScheduler's knob: partial windows verified while the canonical stream idles
    risk_margin: float = 0.0  # DVRGenerator's knob: a draft of smaller margin (logits) closes its window
    risky_windows: str = "ride"  # DefaultScheduler's knob: what a window closed at a risky draft does
    scheduler_order: str = DEFAULT_ORDER  # DefaultScheduler's knob (order=): who is served first where rows are short
    scheduler_admission: str = "arrival"  # DefaultScheduler's knob (admission=): who is admitted first
    # DefaultScheduler's knob (max_wait_steps=, with admission "budget"): a request queued that long is admitted next
    scheduler_max_wait_steps: int | None = None
    canonical_sms: int | None = None  # DVRGenerator's knob: the canonical pass's kernels on that many SMs (CUDA)
    canonical_sms_max_rows: int | None = None  # DVRGenerator's knob: only passes of at most that many rows confined
    gc_freeze: bool = False  # the timed run inside ``frozen_gc`` (what ``llm42 serve`` does), after the warm-up
    prompt_drafts: bool = False  # DVRGenerator's knob: deterministic requests draft from a fast run of their prompt
    split_pass_steps: bool = False  # DVRGenerator's knob: a step that applies a pass launches none
    pass_before_read: bool = False  # DVRGenerator's knob: a pass launched before the previous fast step is read
    apply_before_read: bool = True  # DVRGenerator's knob: a pass finished by the fast launch applied before the read
    canonical_slices: int = 1  # DVRGenerator's knob: each canonical pass's layers in slices, one a step
    tune_decode_buckets: bool = False  # DVRGenerator's knob: a batch replays a faster, larger decode bucket's graph
    mixed_steps: bool | None = None  # DVRGenerator's knob: decode rows and prompt chunks in one pass (None: on CUDA)
    # the scheduler's class: DefaultScheduler or a subclass taking its keywords (an A/B of a scheduling rule)
    scheduler_class: type = DefaultScheduler

    def generator(self, mode: Mode, *, window: int | None = None, group: int | None = None,
                  ) -> tuple[DVRGenerator, list[str]]:
        """A fresh generator for ``mode``, and notes on how it deviates from the plan (empty normally)."""
        kernel = self.canonical_attention
        fast_policy = (BatchInvariantPolicy(attention_kernel=kernel, tile_m=self.canonical_tile_m)
                       if mode.is_batch_invariant else self.fast_policy)
        gen = DVRGenerator(
            self.model.weights, self.model.cfg,
            window=window or self.window, group=group or self.group,
            fast_policy=fast_policy,
            canonical_policy=FixedShapePolicy(attention_kernel=kernel, gemm=self.canonical_gemm,
                                              tile_m=self.canonical_tile_m, gemm_rows=self.canonical_gemm_rows),
            kv_cache_tokens=self.kv_cache_tokens,
            max_num_seqs=self.max_num_seqs, max_fast_tokens=self.max_fast_tokens,
            use_cuda_graphs=self.use_cuda_graphs, overlap=mode.is_overlapped,
            max_canonical_tokens=self.max_canonical_tokens, canonical_stream=self.canonical_stream,
            draft_ahead=self.draft_ahead, wide_verify=self.wide_verify, adaptive_draft=self.adaptive_draft,
            scheduler=self.scheduler_class(prompt_share=self.prompt_share, eager_verify=self.eager_verify,
                                           risky_windows=self.risky_windows, order=self.scheduler_order,
                                           admission=self.scheduler_admission,
                                           **({} if self.scheduler_max_wait_steps is None
                                              else {"max_wait_steps": self.scheduler_max_wait_steps})),
            prioritize_fast=self.prioritize_fast, canonical_priority=self.canonical_priority,
            canonical_gemm_streams=self.canonical_gemm_streams,
            graph_bucket_step=self.graph_bucket_step, chain_passes=self.chain_passes, risk_margin=self.risk_margin,
            canonical_sms=self.canonical_sms, canonical_sms_max_rows=self.canonical_sms_max_rows,
            prompt_drafts=self.prompt_drafts,
            split_pass_steps=self.split_pass_steps, pass_before_read=self.pass_before_read,
            apply_before_read=self.apply_before_read,
            canonical_slices=self.canonical_slices, tune_decode_buckets=self.tune_decode_buckets,
            mixed_steps=self.mixed_steps,
        )
        notes = []
        if self.use_cuda_graphs and gen.device.type == "cuda":
            notes += capture_prefill_graphs(gen) + capture_decode_graphs(gen) + capture_mixed_graphs(gen)
            if self.tune_decode_buckets and gen.fast_step.decode_graphs is not None:
                remap = gen.fast_step.tune_decode_buckets()  # what capture_graphs does with the knob on
                notes.append("decode buckets replayed on larger ones' graphs: "
                             + (", ".join(f"{b}->{t}" for b, t in sorted(remap.items())) or "none"))
        return gen, notes


def capture_decode_graphs(gen: DVRGenerator, *, buckets: tuple[int, ...] | None = None) -> list[str]:
    """Capture decode-graph buckets (greedy and sampling variants; default every bucket) of ``gen`` before timing.

    ``DecodeGraphs`` captures a bucket the first time a step of that size runs; a
    benchmark would time those captures. Each bucket is captured here on a batch
    of padding rows only (token 0 at position 0, K/V written to the scratch
    block), which leaves every request slot untouched. The generator graphs every
    fast policy that declares ``is_graph_safe`` (BatchInvariantPolicy too), so the
    baseline pays no launch overhead the peers' engines avoid. A capture failure
    does not end the run: it goes on eagerly and its notes say so.
    """
    graphs = gen.fast_step.decode_graphs
    if graphs is None:
        return [f"{type(gen.fast_policy).__name__} ran without decode CUDA graphs"]
    try:
        gen.fast_step.capture_decode(None if buckets is None else tuple(graphs.bucket_for(b) for b in buckets))
        torch.cuda.synchronize(gen.device)
    except Exception as exc:  # noqa: BLE001 - reported in the run's notes, the run continues eagerly
        gen.fast_step.drop_decode_graphs()
        return [f"decode CUDA graphs for {type(gen.fast_policy).__name__} failed ({type(exc).__name__}: {exc}); "
                "ran eagerly"]
    return []  # notes say how a run deviated from the plan; this one did not


def capture_prefill_graphs(gen: DVRGenerator) -> list[str]:
    """Capture every fast-prefill row bucket (every sampling variant) of ``gen`` before timing
    (``FastStep.capture_prefill``: on padding rows only, token 0 at position 0, K/V written to scratch slots;
    between steps). A failure sends
    prefill down the eager path, and the notes say so.
    """
    prefill = gen.fast_step.fast_prefill
    if getattr(prefill, "graphs", None) is None:
        return []
    try:
        gen.fast_step.capture_prefill()
        torch.cuda.synchronize(gen.device)
    except Exception as exc:  # noqa: BLE001 - reported in the run's notes, the run continues eagerly
        prefill.graphs = None
        return [f"prefill CUDA graphs failed ({type(exc).__name__}: {exc}); prefill ran eagerly"]
    return []


def capture_mixed_graphs(gen: DVRGenerator, *, decode_rows: tuple[int, ...] | None = None) -> list[str]:
    """Capture every mixed-step graph (decode bucket x prompt bucket x the mixed sampler variants) of a fresh
    ``gen`` before timing, on padding rows only, like ``capture_prefill_graphs``; ``decode_rows``: only the
    decode buckets of these batch sizes. A failure sends the steps that would have been mixed down two passes,
    and the notes say so."""
    mixed = gen.fast_step.mixed
    if getattr(mixed, "graphs", None) is None:
        return []
    try:
        gen.fast_step.capture_mixed(None if decode_rows is None
                                    else tuple(sorted({mixed.decode_bucket(n) for n in decode_rows})))
        torch.cuda.synchronize(gen.device)
    except Exception as exc:  # noqa: BLE001 - reported in the run's notes, the run continues with two passes
        gen.fast_step.mixed = None
        return [f"mixed-step CUDA graphs failed ({type(exc).__name__}: {exc}); decode and prompt rows ran as "
                "two passes"]
    return []


def _release(device: torch.device) -> None:
    # generators hold reference cycles (decode state <-> graphs): on CUDA free each run's K/V store and graphs
    # now; on the CPU a collection per run costs more than the memory it frees early
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()


def _warm_up(gen: DVRGenerator, mode: Mode) -> dict[str, int]:
    # three tokens each, greedy and sampled: prefill, fast decode and (deterministic) a verify window with
    # both sampler variants all run once
    params = [SamplingParams(max_new_tokens=WARMUP_NEW_TOKENS, ignore_eos=True),
              SamplingParams(max_new_tokens=WARMUP_NEW_TOKENS, ignore_eos=True, temperature=0.8, seed=1)]
    if mode.has_canonical_passes:
        params += [dataclasses.replace(p, deterministic=True) for p in params]
    gen.generate([list(WARMUP_PROMPT)] * len(params), params)
    return dict(gen.stats)


def _stats_since(gen: DVRGenerator, before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in gen.stats.items()}


# (name, owner, method): the engine phases an online run times per step (``StepRecord.phases``); "apply" and
# "launch" hold "pass_wait" / "commits" and "stage"; nested finer (round 41): "launch" holds "verifier_launch",
# which holds "stage" (of it "stage_rows", the static rows, and "stage_sampling") and "pass_run" (the graph replays,
# sampler, details), "fast_launch" holds "flush" (the decode state's queued updates sent to the device)
PHASES = (("admit", "gen", "_admit"), ("apply", "passes", "apply_oldest"), ("pass_wait", "verifier", "finish"),
          ("commits", "passes", "_apply_commits"), ("schedule", "scheduler", "schedule"),
          ("fast_launch", "fast_step", "launch"), ("fast_read", "fast_step", "read"),
          ("launch", "passes", "launch"), ("stage", "canonical_pass", "stage"),
          ("verifier_launch", "verifier", "launch"), ("stage_rows", "rows", "stage_segments"),
          ("stage_sampling", "canonical_pass", "_stage_sampling"), ("pass_run", "canonical_pass", "_run_with_details"),
          ("flush", "decode_state", "flush"))


def _time_phases(gen: DVRGenerator, totals: dict[str, float]) -> None:
    """Wrap each of ``PHASES``' methods on its instance (the class is untouched): its wall time adds to
    ``totals[name]``. A phase whose owner the generator lacks (an injected verifier) is skipped."""
    owners = {"gen": gen, "passes": gen.passes, "verifier": gen.verifier, "scheduler": gen.scheduler,
              "fast_step": gen.fast_step,
              "canonical_pass": getattr(gen.verifier, "canonical_pass", None),
              "rows": getattr(getattr(gen.verifier, "canonical_pass", None), "_rows", None),
              "decode_state": getattr(gen, "decode_state", None)}
    for name, owner_name, method in PHASES:
        owner = owners[owner_name]
        fn = getattr(owner, method, None)
        if fn is None:
            continue

        def timed(*args, _fn=fn, _name=name, **kwargs):
            t = time.perf_counter()
            try:
                return _fn(*args, **kwargs)
            finally:
                totals[_name] = totals.get(_name, 0.0) + time.perf_counter() - t

        setattr(owner, method, timed)


def _pass_in_flight(gen) -> bool:
    """Whether ``gen``'s oldest canonical pass in flight is still running on the device (False for a generator
    without ``passes``, a stand-in's; ``is_ready`` queries the pass's event, it waits for nothing)."""
    oldest = getattr(getattr(gen, "passes", None), "oldest", None)
    return oldest is not None and not oldest.is_ready()


class _Tracker:
    """Turns the events of ``step()`` into per-request records. ``time_phases``: also time each step's engine
    phases (``PHASES``) into its ``StepRecord.phases``."""

    def __init__(self, gen: DVRGenerator, clock: Clock, *, time_phases: bool = False):
        self.gen = gen
        self.clock = clock
        # a DVRGenerator hands over the tokens read back before its canonical phase (``step(deliver=...)``), as
        # AsyncEngine streams them: each token is timed when handed over; a stand-in generator's when step returns
        self._takes_deliver = takes_deliver(gen.step)
        self._phases: dict[str, float] | None = {} if time_phases else None
        if time_phases:
            _time_phases(gen, self._phases)
        self.records: dict[int, RequestRecord] = {}  # rid -> record
        self.max_tokens: dict[int, int] = {}
        self.num_open = 0
        self.steps: list[StepRecord] = []  # one per step() (``free_gap_attribution``)
        self.gc_s = 0.0  # the collector's time so far, while ``collecting`` is entered
        self._gc_started: float | None = None

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        elif self._gc_started is not None:
            self.gc_s += time.perf_counter() - self._gc_started
            self._gc_started = None

    @contextmanager
    def collecting(self) -> Iterator[None]:
        """Time the cyclic collector's passes while the block runs (``gc.callbacks``): each step's share is in
        its ``StepRecord.gc_s``."""
        gc.callbacks.append(self._on_gc)
        try:
            yield
        finally:
            gc.callbacks.remove(self._on_gc)

    def submit(self, workload: Workload, index: int, is_deterministic: bool, arrival_s: float) -> None:
        request = workload.requests[index]
        rid = self.gen.submit(list(request.prompt), sampling_params(request, is_deterministic=is_deterministic))
        self.records[rid] = RequestRecord(index, is_deterministic, arrival_s)
        self.max_tokens[rid] = request.max_new_tokens
        self.num_open += 1

    def step(self, t0: float) -> None:
        stats = self.gen.stats
        start, launched, gc_before = self.clock.now() - t0, stats["canonical_passes"], self.gc_s
        rows_before = stats.get("canonical_rows", 0)  # a stand-in generator (tests) may count no rows
        tokens_before = stats.get("fast_tokens", 0)
        in_flight = _pass_in_flight(self.gen)
        if self._phases is not None:
            self._phases.clear()
        index = len(self.steps)
        delivered: list[tuple[int, list[int], float]] = []  # (rid, tokens, when handed over)

        def deliver(events: dict[int, list[int]]) -> None:  # the tokens read back before the canonical phase
            now = self.clock.now() - t0
            delivered.extend((rid, tokens, now) for rid, tokens in events.items())

        events = self.gen.step(deliver=deliver) if self._takes_deliver else self.gen.step()
        now = self.clock.now() - t0
        delivered.extend((rid, tokens, now) for rid, tokens in events.items())
        deterministic = 0
        for rid, tokens, at in delivered:
            rec = self.records.get(rid)
            if rec is None or not tokens:
                continue
            deterministic += rec.is_deterministic
            if rec.first_token_s is None:
                rec.first_token_s = at
            rec.delivery_s.append(at)
            rec.delivery_step.append(index)
            rec.returned_s.append(now)
            rec.num_tokens += len(tokens)
            if rec.num_tokens >= self.max_tokens[rid]:
                rec.finish_s = at
                self.num_open -= 1
        self.steps.append(StepRecord(start, now, stats["canonical_passes"] - launched, deterministic,
                                     self.gc_s - gc_before,
                                     None if self._phases is None else dict(self._phases),
                                     stats.get("canonical_rows", 0) - rows_before,
                                     stats.get("fast_tokens", 0) - tokens_before, in_flight))

    def collect(self) -> list[RequestRecord]:
        for rid, rec in self.records.items():
            if rec.is_finished:
                completion = self.gen.result(rid)
                rec.token_ids = list(completion.token_ids)
                rec.num_rollbacks = completion.num_rollbacks
                rec.num_recomputed = completion.num_recomputed
            elif rec.num_tokens:
                rec.token_ids = self.gen.committed_tokens(rid)
        return sorted(self.records.values(), key=lambda r: r.index)


def _order_within(det_order: list[int], workload: Workload) -> list[int]:
    # a workload's head keeps the full set's order, so shares refer to the requests actually served
    return [i for i in det_order if i < workload.num_requests]


def _run_deadline(deadline: float, budget_s: float | None) -> float:
    return deadline if budget_s is None else min(deadline, time.perf_counter() + budget_s)


def run_offline(engine: Engine, workload: Workload, mode: Mode, *, det_order: list[int], deadline: float,
                max_requests: int | None = None, window: int | None = None, group: int | None = None,
                budget_s: float | None = None) -> RunResult:
    """All requests arrive at time 0 (one-at-a-time modes serve them in ``det_order``).

    ``deadline`` (perf_counter) bounds the whole call, the generator's build (graph captures) included;
    ``budget_s``, if given, bounds the timed run alone, from its first request.
    """
    gen, notes = engine.generator(mode, window=window, group=group)
    before = _warm_up(gen, mode)
    deadline = _run_deadline(deadline, budget_s)
    clock = Clock(engine.model.weights.device)
    order = _order_within(det_order, workload)
    deterministic = deterministic_indices(mode, order)
    indices = order[:max_requests] if mode.is_one_at_a_time else list(range(workload.num_requests))
    tracker = _Tracker(gen, clock)
    is_complete = True
    # after the warm-up: what a serving process has built is frozen; the collector's passes timed per step
    with frozen_gc(engine.gc_freeze), tracker.collecting():
        t0 = clock.start()
        event = clock.start_event()
        if mode.is_one_at_a_time:
            for index in indices:
                tracker.submit(workload, index, index in deterministic, 0.0)
                while tracker.num_open:
                    if time.perf_counter() > deadline:
                        break
                    tracker.step(t0)
                if tracker.num_open:
                    is_complete = False
                    break
        else:
            for index in indices:
                tracker.submit(workload, index, index in deterministic, 0.0)
            while tracker.num_open:
                if time.perf_counter() > deadline:
                    is_complete = False
                    break
                tracker.step(t0)
        device_elapsed = clock.elapsed_since(event)
        elapsed = clock.stop() - t0
    result = RunResult(mode.name, tracker.collect(), elapsed, device_elapsed, _stats_since(gen, before),
                       is_complete, notes, tracker.steps)
    del gen, tracker
    _release(clock.device)
    return result


def run_online(engine: Engine, workload: Workload, mode: Mode, arrivals: list[float], *, det_order: list[int],
               deadline: float, budget_s: float | None = None) -> RunResult:
    """Requests are submitted between steps once the wall clock passes their arrival time (``deadline`` and
    ``budget_s`` as for ``run_offline``)."""
    if mode.is_one_at_a_time:
        raise ValueError("online runs serve requests as they arrive; one-at-a-time modes are offline only")
    gen, notes = engine.generator(mode)
    before = _warm_up(gen, mode)
    deadline = _run_deadline(deadline, budget_s)
    clock = Clock(engine.model.weights.device)
    deterministic = deterministic_indices(mode, _order_within(det_order, workload))
    tracker = _Tracker(gen, clock, time_phases=True)
    num_submitted, is_complete = 0, True
    with frozen_gc(engine.gc_freeze), tracker.collecting():
        t0 = clock.start()
        event = clock.start_event()
        while num_submitted < workload.num_requests or tracker.num_open:
            if time.perf_counter() > deadline:
                is_complete = False
                break
            now = clock.now() - t0
            while num_submitted < workload.num_requests and arrivals[num_submitted] <= now:
                tracker.submit(workload, num_submitted, num_submitted in deterministic, arrivals[num_submitted])
                num_submitted += 1
            if tracker.num_open:
                tracker.step(t0)
            elif num_submitted < workload.num_requests:
                time.sleep(max(0.0, min(arrivals[num_submitted] - now, deadline - time.perf_counter())))
        device_elapsed = clock.elapsed_since(event)
        elapsed = clock.stop() - t0
    result = RunResult(mode.name, tracker.collect(), elapsed, device_elapsed, _stats_since(gen, before),
                       is_complete, notes, tracker.steps)
    del gen, tracker
    _release(clock.device)
    return result


def batch_invariance_check(engine: Engine, workload: Workload, batched: RunResult, *, num_requests: int,
                           deadline: float) -> dict:
    """Re-run the first requests of ``workload`` alone through BatchInvariantPolicy; compare with ``batched``."""
    outputs = {r.index: r.token_ids for r in batched.records if r.is_finished}
    checked, mismatched = 0, []
    for index in sorted(outputs)[:num_requests]:
        if time.perf_counter() > deadline:
            break
        gen, _ = engine.generator(BATCH_INVARIANT)
        request = workload.requests[index]
        alone = gen.generate([list(request.prompt)], sampling_params(request, is_deterministic=False))[0]
        del gen
        _release(engine.model.weights.device)
        checked += 1
        if list(alone.token_ids) != outputs[index]:
            mismatched.append(index)
    return {"workload": workload.name, "num_checked": checked, "num_identical": checked - len(mismatched),
            "mismatched_requests": mismatched}
