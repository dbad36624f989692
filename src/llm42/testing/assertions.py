"""Assertion helpers: run arrival schedules and compare requests with their batch-size-1 reference.

The contract of ``deterministic=True`` is that a request's committed tokens and
log-probs are exactly what the same generator returns when the request runs
alone. :func:`assert_matches_reference` checks precisely that, bit for bit,
across any number of arrival schedules::

    from functools import partial
    from llm42 import DVRGenerator
    from llm42.testing import assert_matches_reference

    factory = partial(DVRGenerator.from_config, cfg, weight_seed=0, window=4, group=2)
    assert_matches_reference(factory, prompts, params, schedules=[(0, 0, 1), (2, 1, 0)])

This module needs only llm42 itself (no hypothesis).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from llm42.generator import DVRGenerator
from llm42.params import Completion, SamplingParams

__all__ = [
    "Divergence", "ScheduleRun", "ReferenceCheck", "run_schedule", "first_divergence",
    "check_against_reference", "assert_matches_reference",
]

_MAX_REPORTED = 5


def _params_list(params: SamplingParams | Sequence[SamplingParams], num_prompts: int) -> list[SamplingParams]:
    if isinstance(params, SamplingParams):
        return [params] * num_prompts
    params_list = list(params)
    if len(params_list) != num_prompts:
        raise ValueError(f"params has {len(params_list)} entries for {num_prompts} prompts")
    return params_list


def _check_schedule(schedule: Sequence[int], num_prompts: int) -> tuple[int, ...]:
    schedule = tuple(schedule)
    if len(schedule) != num_prompts:
        raise ValueError(f"schedule has {len(schedule)} entries for {num_prompts} prompts")
    for step in schedule:
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"schedule entries must be step indices (ints >= 0), got {step!r}")
    return schedule


def _check_after(after: Mapping[int, int] | None, num_prompts: int) -> dict[int, int]:
    if after is None:
        return {}
    follow_ups = dict(after)
    for i, j in follow_ups.items():
        for name, index in (("key", i), ("value", j)):
            if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < num_prompts:
                raise ValueError(f"after {name} {index!r} is not an index into prompts")
    for start in follow_ups:
        seen, index = {start}, start
        while index in follow_ups:
            index = follow_ups[index]
            if index in seen:
                raise ValueError(f"after has a cycle through request {start}")
            seen.add(index)
    return follow_ups


def run_schedule(
    generator: DVRGenerator,
    prompts: Sequence,
    params: SamplingParams | Sequence[SamplingParams],
    schedule: Sequence[int],
    *,
    after: Mapping[int, int] | None = None,
    max_steps: int = 100_000,
    on_step: Callable[[int, dict[int, list[int]]], None] | None = None,
) -> list[Completion]:
    """Submit ``prompts[i]`` right before engine step ``schedule[i]``, run to completion, return Completions.

    Steps are counted from 0; requests due at the same step are submitted in
    index order. A step at which the generator has nothing to run is an idle
    tick (no ``step()`` call). ``after`` makes follow-ups: ``after[i] = j``
    holds request i back until request j has finished (then it is submitted
    before the next step, or at ``schedule[i]`` if that is later) — the next
    turn of a conversation, or a request that shares a prompt prefix with j
    and is sure to find j's K/V in the prefix cache. ``on_step(step_index,
    events)`` is called after every ``generator.step()`` with the events it
    returned. Results come back in the order of ``prompts``. Raises
    RuntimeError if the requests have not all finished ``max_steps`` steps
    after the last arrival.
    """
    params_list = _params_list(params, len(prompts))
    schedule = _check_schedule(schedule, len(prompts))
    follow_ups = _check_after(after, len(prompts))
    pending = list(range(len(prompts)))
    rids: dict[int, int] = {}
    results: dict[int, Completion] = {}

    def has_finished(index: int) -> bool:
        if index in results:
            return True
        if index not in rids:
            return False
        try:
            results[index] = generator.result(rids[index])
        except ValueError:  # not finished yet
            return False
        return True

    step = 0
    last_arrival = max(schedule, default=-1)
    while pending or generator.has_unfinished():
        if step > last_arrival + max_steps:
            raise RuntimeError(f"requests still unfinished {max_steps} steps after the last arrival "
                               f"(schedule {schedule}, after {follow_ups}, stats {generator.stats})")
        due = [i for i in pending if schedule[i] <= step and (i not in follow_ups or has_finished(follow_ups[i]))]
        for index in due:
            rids[index] = generator.submit(prompts[index], params_list[index])
            pending.remove(index)
            last_arrival = max(last_arrival, step)
        if generator.has_unfinished():
            events = generator.step()
            if on_step is not None:
                on_step(step, events)
        step += 1
    return [results[i] if i in results else generator.result(rids[i]) for i in range(len(prompts))]


@dataclass(frozen=True)
class Divergence:
    """Where a request's output first differs from its reference.

    ``position`` is the index into the generated tokens. A missing token
    (one output is shorter) or missing log-prob is ``None``. ``kind`` is
    ``"token"``, ``"logprob"`` (same token, different bits), ``"length"``,
    ``"logprobs_presence"`` or ``"finish_reason"``.
    """

    index: int
    schedule: tuple[int, ...] | None
    kind: str
    position: int
    reference_token: int | None
    actual_token: int | None
    reference_logprob: float | None
    actual_logprob: float | None
    reference: Completion
    actual: Completion

    def describe(self) -> str:
        where = "alone" if self.schedule is None else f"under arrival schedule {self.schedule}"
        lines = [
            f"request {self.index} diverged from its batch-size-1 reference {where}: {self.kind} "
            f"differs at output position {self.position} (prompt length {len(self.reference.prompt_token_ids)})",
            f"  reference: token {self.reference_token}, logprob {_fmt_logprob(self.reference_logprob)}",
            f"  actual:    token {self.actual_token}, logprob {_fmt_logprob(self.actual_logprob)}",
        ]
        lo, hi = max(0, self.position - 3), self.position + 4
        lines.append(f"  reference tokens[{lo}:{hi}] = {self.reference.token_ids[lo:hi]}, "
                     f"finish_reason {self.reference.finish_reason!r}")
        lines.append(f"  actual    tokens[{lo}:{hi}] = {self.actual.token_ids[lo:hi]}, "
                     f"finish_reason {self.actual.finish_reason!r}, rollbacks {self.actual.num_rollbacks}")
        return "\n".join(lines)


def _fmt_logprob(value: float | None) -> str:
    return "None" if value is None else f"{value!r} ({float(value).hex()})"


def _same_bits(a: float, b: float) -> bool:
    return float(a).hex() == float(b).hex()


def first_divergence(
    reference: Completion, actual: Completion, *, index: int = 0, schedule: tuple[int, ...] | None = None
) -> Divergence | None:
    """The first difference between two completions of the same request, or None if identical.

    Tokens are compared by id and log-probs by their bits (``float.hex``), so
    ``-0.0`` vs ``0.0`` or a last-ulp difference counts. Log-probs are compared
    when both completions carry them; one carrying them and the other not is a
    ``logprobs_presence`` divergence.
    """

    def found(kind: str, position: int) -> Divergence:
        def at(c: Completion, seq: list | None):
            return seq[position] if seq is not None and position < len(seq) else None

        return Divergence(
            index, schedule, kind, position,
            at(reference, reference.token_ids), at(actual, actual.token_ids),
            at(reference, reference.logprobs), at(actual, actual.logprobs),
            reference, actual,
        )

    ref_lp, act_lp = reference.logprobs, actual.logprobs
    if (ref_lp is None) != (act_lp is None):
        return found("logprobs_presence", 0)
    num_common = min(len(reference.token_ids), len(actual.token_ids))
    for pos in range(num_common):
        if reference.token_ids[pos] != actual.token_ids[pos]:
            return found("token", pos)
        if ref_lp is not None and not _same_bits(ref_lp[pos], act_lp[pos]):
            return found("logprob", pos)
    if len(reference.token_ids) != len(actual.token_ids):
        return found("length", num_common)
    if reference.finish_reason != actual.finish_reason:
        return found("finish_reason", num_common)
    return None


@dataclass(frozen=True)
class ScheduleRun:
    """One arrival schedule's run: its completions (in prompt order) and the generator's final stats."""

    schedule: tuple[int, ...]
    completions: list[Completion]
    stats: dict[str, int]


@dataclass(frozen=True)
class ReferenceCheck:
    """The outcome of comparing requests with their batch-size-1 references."""

    indices: tuple[int, ...]  # the requests compared
    references: dict[int, Completion]  # index -> the request's batch-size-1 completion
    runs: tuple[ScheduleRun, ...]
    divergences: tuple[Divergence, ...]
    after: dict[int, int] = field(default_factory=dict)  # the follow-ups every run had (see run_schedule)

    @property
    def num_rollbacks(self) -> int:
        """Rollbacks over all schedule runs (a check with none never exercised a rollback)."""
        return sum(run.stats.get("rollbacks", 0) for run in self.runs)

    def report(self) -> str:
        if not self.divergences:
            return f"all {len(self.indices)} checked requests matched their references in {len(self.runs)} runs"
        shown = self.divergences[:_MAX_REPORTED]
        head = (f"{len(self.divergences)} of {len(self.indices) * len(self.runs)} (request, schedule) checks "
                f"diverged from the batch-size-1 reference")
        if self.after:
            head += " (follow-ups: " + ", ".join(f"request {i} after request {j}" for i, j in self.after.items()) + ")"
        more = len(self.divergences) - len(shown)
        tail = [f"... and {more} more"] if more else []
        return "\n".join([head, *(d.describe() for d in shown), *tail])


def check_against_reference(
    generator_factory: Callable[[], DVRGenerator],
    prompts: Sequence,
    params: SamplingParams | Sequence[SamplingParams],
    *,
    schedules: Sequence[Sequence[int]] | None = None,
    reference_factory: Callable[[], DVRGenerator] | None = None,
    indices: Sequence[int] | None = None,
    after: Mapping[int, int] | None = None,
    max_steps: int = 100_000,
) -> ReferenceCheck:
    """Like :func:`assert_matches_reference` but returns the :class:`ReferenceCheck` instead of raising."""
    if not prompts:
        raise ValueError("prompts is empty")
    params_list = _params_list(params, len(prompts))
    if indices is None:
        indices = [i for i, p in enumerate(params_list) if p.deterministic]
        if not indices:
            raise ValueError("no request has deterministic=True; pass indices= to compare others")
    indices = tuple(indices)
    for i in indices:
        if not isinstance(i, int) or not 0 <= i < len(prompts):
            raise ValueError(f"indices entry {i!r} is not an index into prompts")
    if schedules is None:
        schedules = [(0,) * len(prompts), tuple(range(len(prompts)))]
    schedules = [_check_schedule(s, len(prompts)) for s in schedules]
    if not schedules:
        raise ValueError("schedules is empty")
    follow_ups = _check_after(after, len(prompts))
    reference_factory = generator_factory if reference_factory is None else reference_factory

    references = {i: reference_factory().generate([prompts[i]], [params_list[i]])[0] for i in indices}
    runs, divergences = [], []
    for schedule in schedules:
        gen = generator_factory()
        completions = run_schedule(gen, prompts, params_list, schedule, after=follow_ups, max_steps=max_steps)
        runs.append(ScheduleRun(schedule, completions, dict(gen.stats)))
        for i in indices:
            divergence = first_divergence(references[i], completions[i], index=i, schedule=schedule)
            if divergence is not None:
                divergences.append(divergence)
    return ReferenceCheck(indices, references, tuple(runs), tuple(divergences), follow_ups)


def assert_matches_reference(
    generator_factory: Callable[[], DVRGenerator],
    prompts: Sequence,
    params: SamplingParams | Sequence[SamplingParams],
    *,
    schedules: Sequence[Sequence[int]] | None = None,
    reference_factory: Callable[[], DVRGenerator] | None = None,
    indices: Sequence[int] | None = None,
    after: Mapping[int, int] | None = None,
    max_steps: int = 100_000,
) -> ReferenceCheck:
    """Assert every checked request's tokens and log-probs equal its batch-size-1 reference, bit for bit.

    - Reference: each checked request runs alone, via ``generate``, on a fresh
      generator from ``reference_factory`` (default: ``generator_factory``).
    - Runs: for each arrival schedule (see :func:`run_schedule`; default: all
      at step 0, then one per step), all prompts run on a fresh generator from
      ``generator_factory``; ``after`` adds follow-ups to every run (see
      :func:`run_schedule`).
    - Checked requests: ``indices``, default every request with ``deterministic=True``.

    On any difference raises AssertionError naming, for each divergence, the
    request index, the schedule, the first divergent output position and both
    token ids and log-probs (also as ``float.hex()``). Otherwise returns the
    :class:`ReferenceCheck` (references, per-schedule completions and stats).

    The factories must build generators with the same weights and canonical
    config; they may differ in anything else (fast policy, scheduler, sizes).
    """
    check = check_against_reference(
        generator_factory, prompts, params, schedules=schedules, reference_factory=reference_factory,
        indices=indices, after=after, max_steps=max_steps,
    )
    if check.divergences:
        raise AssertionError(check.report())
    return check
