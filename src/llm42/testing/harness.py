"""The random-batch harness behind ``llm42 check`` and ``llm42 demo``: checked requests inside random traffic.

Each random batch holds the checked (deterministic) requests plus 2-8 non-deterministic
fillers, shuffled, arriving at random steps; every checked request's output is compared
bit for bit with its batch-size-1 reference::

    import random
    from llm42.testing.harness import describe, filler_prompts, run_random_batches

    references = [gen.generate([p], params)[0] for p, params in targets]
    for outcome in run_random_batches(gen, targets, references, filler_prompts(random.Random(0), gen),
                                      num_batches=4, seed=1):
        assert not outcome.divergences, [describe(d) for _, d in outcome.divergences]

This module needs only llm42 itself (no hypothesis).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from llm42.generator import DVRGenerator
from llm42.params import Completion, SamplingParams
from llm42.prompts import render_chat
from llm42.testing.assertions import Divergence, first_divergence, run_schedule

__all__ = ["RandomBatch", "BatchOutcome", "random_batch", "filler_prompts", "random_token_prompts",
           "run_random_batches", "describe", "stat_line", "FILLER_TEXTS"]

FILLER_TEXTS = ("Tom had a red ball", "One day, a cat", "The sun was hot", "Mom said", "A big bird")
_STAT_KEYS = ("steps", "fast_steps", "canonical_passes", "committed_tokens", "accepted_tokens", "rollbacks",
              "recomputed_tokens")


@dataclass(frozen=True)
class RandomBatch:
    """One random batch: requests, the step before which each arrives, and which are checked."""

    prompts: list
    params: list[SamplingParams]
    schedule: list[int]
    targets: list[int | None]  # index into the checked requests, None for filler traffic

    @property
    def num_free(self) -> int:
        return sum(t is None for t in self.targets)


@dataclass(frozen=True)
class BatchOutcome:
    """What one batch did: the engine's counters over it and each checked request that diverged."""

    index: int
    batch: RandomBatch
    stats_delta: dict[str, int]
    divergences: list[tuple[int, Divergence]]  # (index of the checked request, how it diverged)


def random_batch(rng: random.Random, targets: Sequence[tuple[object, SamplingParams]],
                 fillers: Sequence, *, max_context: int, max_arrival: int = 12) -> RandomBatch:
    """The checked requests plus 2-8 non-deterministic fillers (token-id prompts shorter than
    ``max_context``), shuffled, with random arrival steps in [0, max_arrival]."""
    rows = [(prompt, params, i) for i, (prompt, params) in enumerate(targets)]
    for _ in range(rng.randint(2, 8)):
        prompt = rng.choice(fillers)
        params = SamplingParams(
            max_new_tokens=rng.randint(1, min(48, max_context - len(prompt))),
            temperature=rng.choice((0.0, 0.7, 1.0)),
            top_k=rng.choice((0, 20)),
            seed=rng.getrandbits(32),
            deterministic=False,
            ignore_eos=rng.random() < 0.5,
        )
        rows.append((prompt, params, None))
    rng.shuffle(rows)
    schedule = [rng.randint(0, max_arrival) for _ in rows]
    return RandomBatch([r[0] for r in rows], [r[1] for r in rows], schedule, [r[2] for r in rows])


def random_token_prompts(rng: random.Random, generator: DVRGenerator, count: int) -> list[list[int]]:
    """``count`` random token-id prompts of 1 to min(16, context / 8) tokens."""
    longest = max(1, min(16, generator.max_model_len // 8))
    return [[rng.randrange(generator.vocab_size) for _ in range(rng.randint(1, longest))] for _ in range(count)]


def filler_prompts(rng: random.Random, generator: DVRGenerator, *, is_chat: bool = False) -> list[list[int]]:
    """Random token-id prompts, plus a few short texts when the model has a tokenizer (as chat
    messages too when ``is_chat``), all as token ids."""
    fillers = random_token_prompts(rng, generator, 6)
    tokenizer = generator.tokenizer
    if tokenizer is not None:
        fillers += [tokenizer(text)["input_ids"] for text in FILLER_TEXTS]
    if is_chat:
        fillers += [render_chat(tokenizer, [{"role": "user", "content": text}]) for text in FILLER_TEXTS]
    return fillers


def run_random_batches(generator: DVRGenerator, targets: Sequence[tuple[object, SamplingParams]],
                       references: Sequence[Completion], fillers: Sequence, *, num_batches: int, seed: int,
                       on_step: Callable[[int, dict[int, list[int]]], None] | None = None,
                       ) -> Iterator[BatchOutcome]:
    """Run ``num_batches`` random batches (drawn from ``seed``) on ``generator``, one outcome per batch."""
    rng = random.Random(seed)
    max_context = generator.max_model_len
    batches = [random_batch(rng, targets, fillers, max_context=max_context) for _ in range(num_batches)]
    for index, batch in enumerate(batches):
        before = dict(generator.stats)
        outs = run_schedule(generator, batch.prompts, batch.params, batch.schedule, on_step=on_step)
        divergences = []
        for target, out in zip(batch.targets, outs):
            divergence = None if target is None else first_divergence(references[target], out)
            if divergence is not None:
                divergences.append((target, divergence))
        delta = {k: generator.stats[k] - before.get(k, 0) for k in generator.stats}
        yield BatchOutcome(index, batch, delta, divergences)


def describe(d: Divergence) -> str:
    """One line saying where and how a request left its reference."""
    if d.kind == "logprob":
        return (f"same token at output position {d.position}, but its log-prob differs: "
                f"reference {d.reference_logprob!r}, got {d.actual_logprob!r}")
    if d.kind == "token":
        return (f"diverges at output position {d.position}: reference token {d.reference_token}, "
                f"got {d.actual_token}")
    return (f"{d.kind} differs at output position {d.position}: reference has {len(d.reference.token_ids)} "
            f"tokens ({d.reference.finish_reason}), got {len(d.actual.token_ids)} ({d.actual.finish_reason})")


def stat_line(stats: dict[str, int]) -> str:
    """The engine counters a determinism check reports, as ``name=value, ...``."""
    return ", ".join(f"{k}={stats.get(k, 0)}" for k in _STAT_KEYS)
