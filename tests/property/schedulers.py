"""Schedulers the property suite plugs in: the contract must hold for any valid plan."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from llm42 import DefaultScheduler, Plan, PrefillChunk, Scheduler, SchedulerState


class PerturbingScheduler:
    """The default plan, then seeded perturbations that keep it valid and non-empty.

    Canonical and fast prompt chunks are cut to a random length, and some verify
    windows, prompt chunks and fast decodes are deferred to a later step. So
    prompts are chunked at odd boundaries, windows are verified partly full or
    late, and each request shares its passes with a different set of others.
    """

    def __init__(self, seed: int):
        self._inner = DefaultScheduler()
        self._rng = random.Random(seed)

    def _keep(self) -> bool:
        return self._rng.random() < 0.75

    def _cut(self, chunks: tuple[PrefillChunk, ...]) -> tuple[PrefillChunk, ...]:
        return tuple(PrefillChunk(c.rid, self._rng.randint(1, c.num_tokens)) for c in chunks if self._keep())

    def schedule(self, state: SchedulerState) -> Plan:
        plan = self._inner.schedule(state)
        perturbed = Plan(
            fast_decode=tuple(rid for rid in plan.fast_decode if self._keep()),
            fast_prefill=self._cut(plan.fast_prefill),
            verify=tuple(rid for rid in plan.verify if self._keep()),
            canonical_prefill=self._cut(plan.canonical_prefill),
        )
        return plan if perturbed.is_empty else perturbed


class ChunkingScheduler:
    """The default plan with every prompt chunk cut to the next of ``chunk_sizes`` (cycling)."""

    def __init__(self, chunk_sizes: list[int]):
        self._inner = DefaultScheduler()
        self._sizes = list(chunk_sizes)
        self._next = 0

    def _cut(self, chunks: tuple[PrefillChunk, ...]) -> tuple[PrefillChunk, ...]:
        out = []
        for c in chunks:
            out.append(PrefillChunk(c.rid, min(c.num_tokens, self._sizes[self._next % len(self._sizes)])))
            self._next += 1
        return tuple(out)

    def schedule(self, state: SchedulerState) -> Plan:
        plan = self._inner.schedule(state)
        return Plan(plan.fast_decode, self._cut(plan.fast_prefill), plan.verify, self._cut(plan.canonical_prefill))


@dataclass
class RecordingScheduler:
    """Delegates to ``inner`` and keeps every (state, plan) it handed out, one per engine step."""

    inner: Scheduler = field(default_factory=DefaultScheduler)
    history: list[tuple[SchedulerState, Plan]] = field(default_factory=list)

    def schedule(self, state: SchedulerState) -> Plan:
        plan = self.inner.schedule(state)
        self.history.append((state, plan))
        return plan

    @property
    def admission(self) -> str:
        """The inner scheduler's order of admission (``"arrival"`` where it has none)."""
        return getattr(self.inner, "admission", "arrival")

    @property
    def max_wait_steps(self) -> int | None:
        """The inner scheduler's bound on a wait for admission (None where it has none)."""
        return getattr(self.inner, "max_wait_steps", None)


SCHEDULER_KINDS = ("default", "perturbing", "budget", "budget_admit")


def make_scheduler(kind: str, seed: int) -> Scheduler:
    """A scheduler kind the properties draw from: ``"default"``, ``"perturbing"`` (seeded), ``"budget"`` (the
    default scheduler serving the largest output budget left first: other requests' windows and prompts first) or
    ``"budget_admit"`` (the same, admitting the largest budget first too, a request queued 1-4 steps admitted next)."""
    if kind == "perturbing":
        return PerturbingScheduler(seed)
    if kind == "budget_admit":
        return DefaultScheduler(order="budget", admission="budget", max_wait_steps=1 + seed % 4)
    return DefaultScheduler(order="budget") if kind == "budget" else DefaultScheduler()
