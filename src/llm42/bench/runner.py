"""One benchmark run: a mode serving a workload offline (all at once) or online (Poisson arrivals).

Each run gets a fresh generator (so a fresh K/V store: no prefix-cache reuse
between modes) over the same weights. Before its clock starts, a run serves
two short warm-up requests (one deterministic when the mode verifies) so
the generator's one-time work — first launches, kernel compilation, any lazy
capture — stays out of the measurement; the warm-up's engine stats are
subtracted. Timing uses the host clock with the device synchronized at every
reading (CUDA events around the same region are recorded too). A run past
its deadline stops between steps and is marked incomplete.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass

import torch

from llm42.bench.metrics import RequestRecord, RunResult
from llm42.bench.models import BenchModel
from llm42.bench.modes import BATCH_INVARIANT, Mode, deterministic_indices, sampling_params
from llm42.bench.workloads import FIRST_TOKEN_ID, Workload
from llm42.generator import DVRGenerator
from llm42.params import SamplingParams
from llm42.policies import BatchInvariantPolicy, ReductionPolicy

WARMUP_PROMPT = (FIRST_TOKEN_ID, FIRST_TOKEN_ID + 1)
WARMUP_NEW_TOKENS = 3
WARMUP_KV_TOKENS = 64  # K/V positions the warm-up requests need on top of a workload's


class Clock:
    """Host time with the device drained first, so a reading includes all launched work."""

    def __init__(self, device: torch.device):
        self.device = device
        self.is_cuda = device.type == "cuda"

    def now(self) -> float:
        if self.is_cuda:
            torch.cuda.synchronize(self.device)
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
    """

    model: BenchModel
    window: int
    group: int
    kv_cache_tokens: int
    max_num_seqs: int = 256
    use_cuda_graphs: bool = True
    fast_policy: ReductionPolicy | None = None

    def generator(self, mode: Mode, *, window: int | None = None, group: int | None = None,
                  ) -> tuple[DVRGenerator, list[str]]:
        """A fresh generator for ``mode``, and notes on how it deviates from the plan (empty normally)."""
        fast_policy = BatchInvariantPolicy() if mode.is_batch_invariant else self.fast_policy
        gen = DVRGenerator(
            self.model.weights, self.model.cfg,
            window=window or self.window, group=group or self.group,
            fast_policy=fast_policy, kv_cache_tokens=self.kv_cache_tokens,
            max_num_seqs=self.max_num_seqs, use_cuda_graphs=self.use_cuda_graphs,
        )
        notes = []
        if mode.is_batch_invariant and self.use_cuda_graphs and gen.device.type == "cuda":
            notes += _graph_batch_invariant_decode(gen)
        return gen, notes


def _graph_batch_invariant_decode(gen: DVRGenerator) -> list[str]:
    """Capture the batch-invariant fast path's decode CUDA graphs up front.

    The generator graphs every fast policy that declares ``is_graph_safe`` (as
    BatchInvariantPolicy does), so the baseline pays no eager launch overhead
    that the peers' engines (CUDA graphs in their deterministic modes too) avoid.
    Capturing here, before timing, keeps a capture failure from ending the run:
    it then goes on eagerly and says so.
    """
    graphs = gen.decode_graphs
    if graphs is None:
        return ["BatchInvariantPolicy ran without decode CUDA graphs"]
    try:
        gen.generate([[1] * 4] * graphs.max_batch_size, SamplingParams(max_new_tokens=2, ignore_eos=True))
    except Exception as exc:  # noqa: BLE001 - reported in the run's notes, the run continues eagerly
        gen.decode_graphs = None
        return [f"decode CUDA graphs for BatchInvariantPolicy failed ({type(exc).__name__}: {exc}); ran eagerly"]
    return []


def _release(device: torch.device) -> None:
    # generators hold reference cycles (runner <-> decode graphs): free each run's K/V store and graphs now
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _warm_up(gen: DVRGenerator, mode: Mode) -> dict[str, int]:
    # three tokens each: prefill, fast decode and (deterministic) a verify window all run once
    params = [SamplingParams(max_new_tokens=WARMUP_NEW_TOKENS, ignore_eos=True)]
    if mode.has_canonical_passes:
        params.append(SamplingParams(max_new_tokens=WARMUP_NEW_TOKENS, ignore_eos=True, deterministic=True))
    gen.generate([list(WARMUP_PROMPT)] * len(params), params)
    return dict(gen.stats)


def _stats_since(gen: DVRGenerator, before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in gen.stats.items()}


class _Tracker:
    """Turns the events of ``step()`` into per-request records."""

    def __init__(self, gen: DVRGenerator, clock: Clock):
        self.gen = gen
        self.clock = clock
        self.records: dict[int, RequestRecord] = {}  # rid -> record
        self.max_tokens: dict[int, int] = {}
        self.num_open = 0

    def submit(self, workload: Workload, index: int, is_deterministic: bool, arrival_s: float) -> None:
        request = workload.requests[index]
        rid = self.gen.submit(list(request.prompt), sampling_params(request, is_deterministic=is_deterministic))
        self.records[rid] = RequestRecord(index, is_deterministic, arrival_s)
        self.max_tokens[rid] = request.max_new_tokens
        self.num_open += 1

    def step(self, t0: float) -> None:
        events = self.gen.step()
        now = self.clock.now() - t0
        for rid, tokens in events.items():
            rec = self.records.get(rid)
            if rec is None or not tokens:
                continue
            if rec.first_token_s is None:
                rec.first_token_s = now
            rec.num_tokens += len(tokens)
            if rec.num_tokens >= self.max_tokens[rid]:
                rec.finish_s = now
                self.num_open -= 1

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


def run_offline(engine: Engine, workload: Workload, mode: Mode, *, det_order: list[int], deadline: float,
                max_requests: int | None = None, window: int | None = None, group: int | None = None,
                ) -> RunResult:
    """All requests arrive at time 0 (one-at-a-time modes serve them in ``det_order``)."""
    gen, notes = engine.generator(mode, window=window, group=group)
    before = _warm_up(gen, mode)
    clock = Clock(engine.model.weights.device)
    order = _order_within(det_order, workload)
    deterministic = deterministic_indices(mode, order)
    indices = order[:max_requests] if mode.is_one_at_a_time else list(range(workload.num_requests))
    tracker = _Tracker(gen, clock)
    is_complete = True
    event = clock.start_event()
    t0 = clock.now()
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
    elapsed = clock.now() - t0
    device_elapsed = clock.elapsed_since(event)
    result = RunResult(mode.name, tracker.collect(), elapsed, device_elapsed, _stats_since(gen, before),
                       is_complete, notes)
    del gen, tracker
    _release(clock.device)
    return result


def run_online(engine: Engine, workload: Workload, mode: Mode, arrivals: list[float], *, det_order: list[int],
               deadline: float) -> RunResult:
    """Requests are submitted between steps once the wall clock passes their arrival time."""
    if mode.is_one_at_a_time:
        raise ValueError("online runs serve requests as they arrive; one-at-a-time modes are offline only")
    gen, notes = engine.generator(mode)
    before = _warm_up(gen, mode)
    clock = Clock(engine.model.weights.device)
    deterministic = deterministic_indices(mode, _order_within(det_order, workload))
    tracker = _Tracker(gen, clock)
    num_submitted, is_complete = 0, True
    event = clock.start_event()
    t0 = clock.now()
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
    elapsed = clock.now() - t0
    device_elapsed = clock.elapsed_since(event)
    result = RunResult(mode.name, tracker.collect(), elapsed, device_elapsed, _stats_since(gen, before),
                       is_complete, notes)
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
