"""Scoring: ``score`` gives the bits ``Completion.logprobs`` of a deterministic generation committed.

Drawn: the canonical config, a batch mix (deterministic and free requests, greedy and seeded
top-k/top-p sampling, shared prefixes), raw or processed log-probs, the fast path and the
scheduler of the generation; then how the completions are scored: on the generator that made
them (its prefix cache warm) or a fresh one, in a drawn order, split over drawn ``score`` calls,
among drawn filler sequences — so each is chunked into canonical passes differently and shares
them with different rows. The negative control scores through the fast path's kernels with the
same packing and shows the comparison then fails.
"""

from __future__ import annotations

import dataclasses
import random

from hypothesis import given
from hypothesis import strategies as st

from llm42.params import SamplingParams
from llm42.policies import FastPolicy
from llm42.scoring import ScoreJob, score_jobs
from llm42.testing import strategies as ls
from llm42.verify import CanonicalConfig, CanonicalPass

from .schedulers import PerturbingScheduler

MAX_PROMPT_LEN = 16
MAX_NEW_TOKENS = 8


def bits(values: list[float]) -> list[str]:
    return [v.hex() for v in values]


def first_mismatch(committed: list[float], scored: list[float]) -> int | None:
    for i, (a, b) in enumerate(zip(bits(committed), bits(scored), strict=True)):
        if a != b:
            return i
    return None


@given(data=st.data())
def test_score_is_bit_identical_to_committed_logprobs(wide_model, data):
    vocab = wide_model.vocab_size
    canonical = data.draw(ls.canonical_configs(max_window=4, max_group=3), label="canonical")
    mix = data.draw(ls.batch_mixes(vocab_size=vocab, max_size=4, max_prompt_len=MAX_PROMPT_LEN,
                                   max_new_tokens=MAX_NEW_TOKENS, logprobs=True), label="mix")
    mode = data.draw(st.sampled_from(["raw", "processed"]), label="logprobs_mode")
    mix = [(prompt, dataclasses.replace(p, logprobs_mode=mode)) for prompt, p in mix]
    fast_policy = data.draw(ls.fast_policies(), label="fast_policy")
    scheduler_seed = data.draw(st.integers(0, 2**16), label="scheduler_seed")
    gen = wide_model.factory(canonical, fast_policy=fast_policy,
                             scheduler=lambda: PerturbingScheduler(scheduler_seed))()
    outs = gen.generate([prompt for prompt, _ in mix], [p for _, p in mix])
    wanted = [(prompt, out, p) for (prompt, p), out in zip(mix, outs) if p.deterministic]

    scorer = gen if data.draw(st.booleans(), label="same_generator") else wide_model.factory(canonical)()
    fillers = data.draw(st.lists(st.tuples(ls.prompts(vocab_size=vocab, max_len=MAX_PROMPT_LEN),
                                           ls.prompts(vocab_size=vocab, max_len=MAX_NEW_TOKENS)), max_size=3),
                        label="fillers")
    items = [(prompt, out.token_ids, p, out) for prompt, out, p in wanted]
    items += [(prompt, completion, SamplingParams(logprobs_mode=mode), None) for prompt, completion in fillers]
    order = data.draw(st.permutations(range(len(items))), label="order")
    num_calls = data.draw(st.integers(1, max(1, len(items))), label="num_calls")
    calls = [order[i::num_calls] for i in range(num_calls)]
    for call in calls:
        if not call:
            continue
        scored = scorer.score([items[i][0] for i in call], [items[i][1] for i in call], [items[i][2] for i in call])
        for i, lps in zip(call, scored):
            _, completion, _, out = items[i]
            assert len(lps) == len(completion)
            if out is not None:
                at = first_mismatch(out.logprobs, lps)
                assert at is None, (f"scored log-prob {at} of request {i} differs: committed "
                                    f"{out.logprobs[at].hex()}, scored {lps[at].hex()}")
    assert not scorer.has_unfinished()


def _score_with(canonical_pass, items, gen):
    jobs = [ScoreJob(1000 + i, prompt + completion, len(prompt), params, 0)
            for i, (prompt, completion, params) in enumerate(items)]
    score_jobs(canonical_pass, gen.kv, jobs)
    return [job.logprobs for job in jobs]


def test_fast_path_scoring_differs_where_the_canonical_pass_agrees(wide_model):
    """Negative control: the same packing through FastPolicy's kernels (library GEMMs, padded SDPA)
    gives log-prob bits that differ from the committed ones; through the canonical policy it does not.
    If this passed vacuously, the property above would prove nothing."""
    canonical = CanonicalConfig(window=4, group=3)
    rng = random.Random(0)
    prompts = [[rng.randrange(wide_model.vocab_size) for _ in range(rng.randrange(4, 16))] for _ in range(5)]
    params = SamplingParams(max_new_tokens=8, deterministic=True, logprobs=True)
    gen = wide_model.factory(canonical)()
    outs = gen.generate(prompts, params)
    items = [(prompt, out.token_ids, params) for prompt, out in zip(prompts, outs)]

    fast_pass = CanonicalPass(wide_model.weights, wide_model.cfg, FastPolicy(), canonical.num_rows, use_graph=False)
    fast = _score_with(fast_pass, items, gen)
    assert any(first_mismatch(out.logprobs, lps) is not None for out, lps in zip(outs, fast)), \
        "fast-path scoring matched the committed bits: the comparison cannot tell the paths apart"

    canonical_scores = _score_with(gen.verifier.canonical_pass, items, gen)
    assert all(first_mismatch(out.logprobs, lps) is None for out, lps in zip(outs, canonical_scores))
