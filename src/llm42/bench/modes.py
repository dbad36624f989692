"""Benchmark modes: how one request set is served.

- ``nondet``: every request on the fast path, dynamic batching, no
  verification — the throughput ceiling, and not reproducible.
- ``dvr@p``: DVR with a share p% of the requests ``deterministic=True``; the
  rest run as in ``nondet``. The deterministic requests of a smaller share are
  a subset of those of a larger one.
- ``batch_invariant``: the peers' approach — every request through
  ``BatchInvariantPolicy`` (batch-invariant kernels at any batch size), no
  verification; every request is reproducible and every request pays.
- ``no_batching``: every request ``deterministic=True``, served one at a
  time by the same generator — the batch-size-1 reference of the contract.
  Its outputs are what every deterministic request of ``dvr@p`` must equal.
- ``nondet_sync``: ``nondet`` with the engine's host/device overlap off
  (``DVRGenerator(overlap=False)``): each step reads its own tokens back
  before returning. A side-by-side measure of what the overlap buys.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from llm42.bench.workloads import BenchRequest
from llm42.params import SamplingParams

DVR_SHARES: tuple[int, ...] = (5, 10, 20, 50, 100)


@dataclass(frozen=True)
class Mode:
    name: str
    deterministic_share: float  # fraction of requests submitted with deterministic=True
    is_batch_invariant: bool = False  # fast path through BatchInvariantPolicy
    is_one_at_a_time: bool = False
    is_overlapped: bool = True  # DVRGenerator(overlap=...)

    @property
    def has_canonical_passes(self) -> bool:
        return self.deterministic_share > 0

    def num_deterministic(self, num_requests: int) -> int:
        """At least one deterministic request for any share > 0, so small runs still exercise DVR."""
        if self.deterministic_share <= 0:
            return 0
        return min(num_requests, max(1, math.floor(self.deterministic_share * num_requests + 0.5)))


NONDET = Mode("nondet", 0.0)
BATCH_INVARIANT = Mode("batch_invariant", 0.0, is_batch_invariant=True)
NO_BATCHING = Mode("no_batching", 1.0, is_one_at_a_time=True)
NONDET_SYNC = Mode("nondet_sync", 0.0, is_overlapped=False)


def dvr_mode(percent: int) -> Mode:
    if not 0 < percent <= 100:
        raise ValueError(f"a DVR deterministic share must be in (0, 100] percent, got {percent}")
    return Mode(f"dvr@{percent}", percent / 100)


def all_modes(shares: tuple[int, ...] = DVR_SHARES) -> tuple[Mode, ...]:
    """``nondet`` first (the others' ratios refer to it), ``no_batching`` last."""
    return (NONDET, *(dvr_mode(p) for p in shares), BATCH_INVARIANT, NO_BATCHING)


def mode_by_name(name: str, shares: tuple[int, ...] = DVR_SHARES) -> Mode:
    for mode in (*all_modes(shares), NONDET_SYNC):
        if mode.name == name:
            return mode
    if name.startswith("dvr@") and name[4:].isdigit():
        return dvr_mode(int(name[4:]))
    known = [m.name for m in (*all_modes(shares), NONDET_SYNC)]
    raise ValueError(f"unknown mode {name!r}; known: {known} or dvr@<percent>")


def deterministic_order(num_requests: int, *, seed: int) -> list[int]:
    """A seeded permutation of request indices: a share p makes the first ceil-ish(p * n) deterministic."""
    order = list(range(num_requests))
    random.Random(f"deterministic-order-{seed}").shuffle(order)
    return order


def deterministic_indices(mode: Mode, order: list[int]) -> frozenset[int]:
    return frozenset(order[: mode.num_deterministic(len(order))])


def sampling_params(request: BenchRequest, *, is_deterministic: bool) -> SamplingParams:
    """Exactly ``max_new_tokens`` outputs (EOS ignored), the request's own temperature, top-p and seed."""
    return SamplingParams(
        max_new_tokens=request.max_new_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        seed=request.seed,
        deterministic=is_deterministic,
        ignore_eos=True,
    )
