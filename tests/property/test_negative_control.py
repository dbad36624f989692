"""Negative controls: with verification off, the same comparisons the contract tests make do fail.

If these passed vacuously (no drift to detect, or a comparison too coarse to
see it) the contract tests would prove nothing. Each control runs the same
requests twice: with ``deterministic=False`` the comparison reports
differences; with ``deterministic=True`` it reports none.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm42 import SamplingParams
from llm42.policies import NoisyFastPolicy
from llm42.testing import assert_matches_reference, check_against_reference
from llm42.testing import strategies as ls
from llm42.verify import CanonicalConfig

CANONICAL = CanonicalConfig(window=4, group=2)


def _requests(vocab_size: int, num: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab_size) for _ in range(rng.randrange(4, 24))] for _ in range(num)]


def test_unverified_requests_drift_with_the_plain_fast_path(wide_model):
    """Real drift, no injected noise: free greedy requests batched together get log-probs (and often
    tokens) that differ in their bits from running alone, because CPU GEMMs reduce differently per M."""
    prompts = _requests(wide_model.vocab_size, 6, seed=0)
    free = SamplingParams(max_new_tokens=8, logprobs=True)
    schedules = [(0,) * len(prompts)]
    check = check_against_reference(wide_model.factory(CANONICAL), prompts, free, schedules=schedules,
                                    indices=range(len(prompts)))
    assert check.divergences, "batched fast-path output was bit-identical to batch-size-1: nothing to detect"

    deterministic = dataclasses.replace(free, deterministic=True)
    assert_matches_reference(wide_model.factory(CANONICAL), prompts, deterministic, schedules=schedules)


def test_assert_matches_reference_reports_noisy_drift(wide_model):
    """With a noisy fast path and verification off, the assertion fails and names the request, the
    schedule, the first divergent position and both tokens and log-probs (with their hex bits)."""
    prompts = _requests(wide_model.vocab_size, 4, seed=1)
    free = SamplingParams(max_new_tokens=8, logprobs=True)
    factory = wide_model.factory(CANONICAL, fast_policy=NoisyFastPolicy(scale=3.0, seed=5))
    with pytest.raises(AssertionError) as failure:
        assert_matches_reference(factory, prompts, free, schedules=[(0, 1, 1, 2)], indices=range(len(prompts)))
    message = str(failure.value)
    assert "under arrival schedule (0, 1, 1, 2)" in message
    assert "differs at output position" in message
    assert "reference: token" in message and "actual:    token" in message
    assert "0x1." in message  # log-probs are shown as float.hex() too

    deterministic = dataclasses.replace(free, deterministic=True)
    check = assert_matches_reference(factory, prompts, deterministic, schedules=[(0, 1, 1, 2)])
    assert check.num_rollbacks > 0


@settings(max_examples=10)  # a control, not a search: a few examples show the comparison bites
@given(data=st.data())
def test_free_requests_drift_where_deterministic_ones_do_not(wide_model, data):
    """The contract test's exact setting with every request free: across the drawn examples the same
    comparison finds drift (checked per example: a noisy fast path shared by several requests whose
    lifetimes overlap always desynchronises at least one of them)."""
    vocab = wide_model.vocab_size
    canonical = data.draw(ls.canonical_configs(max_window=4, max_group=3), label="canonical")
    mix = data.draw(ls.batch_mixes(vocab_size=vocab, min_size=2, max_size=3, max_prompt_len=24,
                                   max_new_tokens=8, allow_sampling=False), label="mix")
    prompts = [p for p, _ in mix]
    free = [dataclasses.replace(q, deterministic=False, logprobs=True, stop_token_ids=(),
                                max_new_tokens=max(q.max_new_tokens, 4)) for _, q in mix]
    noise_seed = data.draw(st.integers(0, 2**31 - 1), label="noise_seed")
    schedule = (0,) * len(prompts)  # all overlap, so every step batches several requests

    def noisy_factory():
        return wide_model.factory(canonical, fast_policy=NoisyFastPolicy(scale=2.0, seed=noise_seed))()

    check = check_against_reference(noisy_factory, prompts, free, schedules=[schedule],
                                    indices=range(len(prompts)))
    assert check.divergences, "verification off, noisy fast path, yet no request drifted"

    deterministic = [dataclasses.replace(q, deterministic=True) for q in free]
    assert_matches_reference(noisy_factory, prompts, deterministic, schedules=[schedule],
                             reference_factory=wide_model.factory(canonical))
