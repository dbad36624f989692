"""Adaptive speculation depth: halve after a rollback, double after a full accepted window.
It changes when requests draft and verify, never what they commit."""

import pytest

from llm42 import DVRGenerator, SamplingParams
from llm42.engine.requests import Request as _Request
from llm42.model.weights import random_weights
from llm42.policies import NoisyFastPolicy
from llm42.verify import Commit
from tests.helpers import tiny_config

CFG = tiny_config()
WEIGHTS = random_weights(CFG, seed=9, lm_head_std=0.1)
PROMPTS = [[5, 6, 7], [9, 10, 11, 12], [20, 21], [30, 31, 32, 33, 34]]
PARAMS = SamplingParams(max_new_tokens=48, deterministic=True, ignore_eos=True, logprobs=True)


def commit(accepted: int, rejected: int) -> Commit:
    return Commit(0, (1,) * (accepted + 1), (0.0,) * (accepted + 1), accepted, rejected, 1, False)


def test_draft_limit_halves_on_rollback_and_doubles_on_full_acceptance():
    req = _Request(0, [1, 2], PARAMS, 0, frozenset(), 0)
    window = 16
    assert req.num_speculable(window) == 15
    req.adapt_draft_limit(commit(accepted=3, rejected=12), window)
    assert req.draft_limit == 7 and req.num_speculable(window) == 7
    req.adapt_draft_limit(commit(accepted=0, rejected=7), window)
    req.adapt_draft_limit(commit(accepted=0, rejected=3), window)
    req.adapt_draft_limit(commit(accepted=0, rejected=1), window)
    assert req.draft_limit == 1  # never below one candidate
    req.adapt_draft_limit(commit(accepted=1, rejected=0), window)
    assert req.draft_limit == 2
    for _ in range(5):
        req.adapt_draft_limit(commit(accepted=req.draft_limit, rejected=0), window)
    assert req.draft_limit == 15  # capped at the window
    req.adapt_draft_limit(commit(accepted=2, rejected=0), window)  # a short window (e.g. near the end)
    assert req.draft_limit == 15


@pytest.mark.parametrize("scale", [0.5, 2.0])
def test_adaptive_draft_commits_the_same_bits_with_less_recompute(scale):
    def run(adaptive: bool):
        gen = DVRGenerator(WEIGHTS, CFG, window=8, group=2, adaptive_draft=adaptive,
                           fast_policy=NoisyFastPolicy(scale=scale, seed=4))
        return gen.generate(PROMPTS, PARAMS), dict(gen.stats)

    reference = DVRGenerator(WEIGHTS, CFG, window=8, group=2).generate(PROMPTS, PARAMS)
    (fixed, fixed_stats), (adaptive, adaptive_stats) = run(False), run(True)
    for ref, a, b in zip(reference, fixed, adaptive):
        assert a.token_ids == b.token_ids == ref.token_ids
        assert a.logprobs == b.logprobs == ref.logprobs
    assert fixed_stats["rollbacks"] > 0
    assert adaptive_stats["recomputed_tokens"] < fixed_stats["recomputed_tokens"]
    assert adaptive_stats["steps"] <= fixed_stats["steps"]
