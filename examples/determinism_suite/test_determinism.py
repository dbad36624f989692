"""Determinism tests for an llm42 deployment; copy this folder into your project and point it at your model.

    pytest examples/determinism_suite                                   # embedded model, CPU
    pytest examples/determinism_suite --llm42-checkpoint PATH           # your checkpoint
    pytest examples/determinism_suite --llm42-checkpoint PATH --llm42-device cuda

Every test states the contract of ``deterministic=True``: a request's committed
tokens and log-probs equal, bit for bit, what the same canonical config returns
when the request runs alone — whatever else is in the batch, whenever it
arrives, and whatever the fast path computes.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llm42 import SamplingParams
from llm42.policies import NoisyFastPolicy
from llm42.testing import assert_matches_reference
from llm42.testing import strategies as ls

# The canonical config under test. Committed output is a function of it, so the
# reference and the runs it is compared with must share it; use your deployment's.
CANONICAL = {"window": 4, "group": 2}


@pytest.fixture(scope="session")
def vocab_size(llm42_generator_factory) -> int:
    return llm42_generator_factory(**CANONICAL).vocab_size


@given(data=st.data())
def test_deterministic_requests_match_their_batch_size_1_reference(llm42_generator_factory, vocab_size, data):
    # a random mix of deterministic and free requests (token-id prompts, greedy or seeded sampling),
    # arriving at random steps, on a fast path that is plain or perturbed with noise
    mix = data.draw(ls.batch_mixes(vocab_size=vocab_size, max_size=4, max_prompt_len=12, max_new_tokens=10))
    schedule = data.draw(ls.arrival_schedules(num_requests=len(mix)))
    fast_policy = data.draw(ls.fast_policies(max_scale=2.0))
    prompts = [prompt for prompt, _ in mix]
    params = [p for _, p in mix]
    assert_matches_reference(
        lambda: llm42_generator_factory(fast_policy=fast_policy, **CANONICAL),
        prompts,
        params,
        schedules=[schedule],
        reference_factory=lambda: llm42_generator_factory(**CANONICAL),
    )


def test_noisy_fast_path_rolls_back_and_still_matches(llm42_generator_factory, vocab_size):
    # a fast path that is almost always wrong: every window must be repaired by rollbacks,
    # and the suite must see them, or it is not testing verification at all
    prompts = [[1 + i % (vocab_size - 1) for i in range(start, start + 6)] for start in (3, 40, 77)]
    params = [
        SamplingParams(max_new_tokens=12, deterministic=True, logprobs=True, ignore_eos=True),
        SamplingParams(max_new_tokens=12, temperature=0.9, top_k=50, seed=3, deterministic=True,
                       logprobs=True, ignore_eos=True),
        SamplingParams(max_new_tokens=12, temperature=1.0, ignore_eos=True),  # free traffic alongside
    ]
    check = assert_matches_reference(
        lambda: llm42_generator_factory(fast_policy=NoisyFastPolicy(scale=2.0, seed=0), **CANONICAL),
        prompts,
        params,
        schedules=[(0, 0, 0), (2, 0, 1)],
        reference_factory=lambda: llm42_generator_factory(**CANONICAL),
    )
    assert check.num_rollbacks > 0


def test_text_prompts_match_alone_and_in_a_batch(llm42_generator_factory):
    gen = llm42_generator_factory(**CANONICAL)
    if gen.tokenizer is None:
        pytest.skip("the checkpoint has no tokenizer")
    prompts = ["Once upon a time", "The little dog was sad because", "One day, a bird"]
    params = [
        SamplingParams(max_new_tokens=16, temperature=0.8, seed=42, deterministic=True, logprobs=True),
        SamplingParams(max_new_tokens=16, temperature=0.7),
        SamplingParams(max_new_tokens=16, deterministic=True, logprobs=True),
    ]
    assert_matches_reference(lambda: llm42_generator_factory(**CANONICAL), prompts, params,
                             schedules=[(0, 0, 0), (3, 0, 1)])


@pytest.mark.gpu
def test_deterministic_on_cuda_matches_its_reference(llm42_generator_factory):
    # skipped without CUDA (the plugin's gpu marker); on a GPU the same contract holds in bf16
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    params = SamplingParams(max_new_tokens=16, deterministic=True, logprobs=True)
    assert_matches_reference(lambda: llm42_generator_factory(device="cuda", **CANONICAL), prompts, params,
                             schedules=[(0, 0), (0, 1)])
