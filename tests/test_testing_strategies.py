"""llm42.testing itself: every strategy draws valid values within its bounds, and the assertion
helpers run schedules, find the first divergence and report it."""

from __future__ import annotations

import dataclasses
import functools
import math
import subprocess
import sys

import pytest
from hypothesis import find, given, settings
from hypothesis import strategies as st

from llm42 import Completion, DVRGenerator, ModelConfig, SamplingParams
from llm42.model.config import RopeConfig
from llm42.model.weights import random_weights
from llm42.policies import FastPolicy, NoisyFastPolicy
from llm42.testing import (
    assert_matches_reference,
    check_against_reference,
    first_divergence,
    run_schedule,
)
from llm42.testing import strategies as ls
from llm42.verify import CanonicalConfig


KNOBS_CFG = ModelConfig(family="llama", vocab_size=96, hidden_size=32, intermediate_size=64, num_layers=2,
                        num_heads=2, num_kv_heads=1, head_dim=16, max_position_embeddings=128, rms_norm_eps=1e-5,
                        rope=RopeConfig(theta=10000.0), eos_token_ids=(2,), bos_token_id=1)
KNOBS_WEIGHTS = random_weights(KNOBS_CFG, seed=4)


@functools.lru_cache(maxsize=None)
def _knobs_reference(prompt: tuple[int, ...], params: SamplingParams) -> Completion:
    """A deterministic request alone on a generator with every knob at its default: the contract's reference."""
    gen = DVRGenerator(KNOBS_WEIGHTS, KNOBS_CFG, window=4, group=2, kv_cache_tokens=2048, block_size=8)
    return gen.generate([list(prompt)], params)[0]


# -- strategies ------------------------------------------------------------------------------------
@given(data=st.data(), vocab_size=st.integers(1, 1000), min_len=st.integers(1, 10), extra=st.integers(0, 20))
def test_prompts_are_token_ids_within_bounds(data, vocab_size, min_len, extra):
    prompt = data.draw(ls.prompts(vocab_size=vocab_size, min_len=min_len, max_len=min_len + extra))
    assert isinstance(prompt, list)
    assert min_len <= len(prompt) <= min_len + extra
    assert all(isinstance(t, int) and 0 <= t < vocab_size for t in prompt)


@given(
    data=st.data(),
    bounds=st.tuples(st.integers(1, 20), st.integers(0, 20)),
    deterministic=st.none() | st.booleans(),
    allow_sampling=st.booleans(),
    logprobs=st.none() | st.booleans(),
    vocab_size=st.none() | st.integers(1, 600),
    max_stop_ids=st.integers(0, 3),
)
def test_sampling_params_are_valid_and_respect_bounds(data, bounds, deterministic, allow_sampling, logprobs,
                                                       vocab_size, max_stop_ids):
    lo, extra = bounds
    params = data.draw(ls.sampling_params(min_new_tokens=lo, max_new_tokens=lo + extra, deterministic=deterministic,
                                          allow_sampling=allow_sampling, logprobs=logprobs, vocab_size=vocab_size,
                                          max_stop_ids=max_stop_ids))
    assert isinstance(params, SamplingParams)
    # the constructor validated everything; what remains are the strategy's own bounds
    assert lo <= params.max_new_tokens <= lo + extra
    if deterministic is not None:
        assert params.deterministic is deterministic
    if logprobs is not None:
        assert params.logprobs is logprobs
    if not allow_sampling:
        assert params.is_greedy
    else:
        assert params.temperature == 0.0 or 0.05 <= params.temperature <= 2.0
    if vocab_size is None:
        assert params.stop_token_ids == ()
        assert params.top_k <= 64
    else:
        assert len(params.stop_token_ids) <= max_stop_ids
        assert len(set(params.stop_token_ids)) == len(params.stop_token_ids)
        assert all(0 <= t < vocab_size for t in params.stop_token_ids)
        assert params.top_k <= vocab_size


@given(data=st.data(), num_requests=st.integers(1, 8), max_gap=st.integers(0, 4))
def test_arrival_schedules_are_step_indices_with_bounded_gaps(data, num_requests, max_gap):
    schedule = data.draw(ls.arrival_schedules(num_requests=num_requests, max_gap=max_gap))
    assert isinstance(schedule, tuple) and len(schedule) == num_requests
    assert all(isinstance(s, int) and s >= 0 for s in schedule)
    steps = sorted(schedule)
    assert steps[0] == 0
    assert all(0 <= b - a <= max_gap for a, b in zip(steps, steps[1:]))


@given(data=st.data(), vocab_size=st.integers(2, 600), sizes=st.tuples(st.integers(1, 4), st.integers(0, 3)),
       min_det=st.integers(0, 2), max_prompt_len=st.integers(1, 24), max_new_tokens=st.integers(1, 12),
       allow_sampling=st.booleans(), shared_prefixes=st.booleans(), logprobs=st.none() | st.booleans())
def test_batch_mixes_are_valid_requests_with_enough_deterministic_ones(
        data, vocab_size, sizes, min_det, max_prompt_len, max_new_tokens, allow_sampling, shared_prefixes,
        logprobs):
    min_size, extra = sizes
    max_size = max(min_size + extra, min_det)
    mix = data.draw(ls.batch_mixes(vocab_size=vocab_size, min_size=min_size, max_size=max_size,
                                   min_deterministic=min_det, max_prompt_len=max_prompt_len,
                                   max_new_tokens=max_new_tokens, allow_sampling=allow_sampling,
                                   shared_prefixes=shared_prefixes, logprobs=logprobs))
    assert min_size <= len(mix) <= max_size
    assert sum(p.deterministic for _, p in mix) >= min_det
    for prompt, params in mix:
        assert 1 <= len(prompt) <= max_prompt_len
        assert all(0 <= t < vocab_size for t in prompt)
        assert isinstance(params, SamplingParams) and params.max_new_tokens <= max_new_tokens
        assert allow_sampling or params.is_greedy
        assert logprobs is None or params.logprobs is logprobs


def test_batch_mixes_still_draw_logprobs_by_default():
    """``logprobs`` was added keyword-only with the old behaviour as its default: drawn per request."""
    seen: set[bool] = set()

    @given(mix=ls.batch_mixes(vocab_size=64, min_size=3, max_size=4))
    def look(mix):
        seen.update(p.logprobs for _, p in mix)

    look()
    assert seen == {True, False}
    with pytest.raises(TypeError, match="logprobs"):
        ls.batch_mixes(vocab_size=64, logprobs=1)
    with pytest.raises(TypeError):
        ls.batch_mixes(64)  # type: ignore[misc]


def test_batch_mixes_draw_both_kinds_and_shared_prefixes():
    seen_free, seen_shared = False, False

    @given(mix=ls.batch_mixes(vocab_size=512, min_size=3, max_size=4))
    def look(mix):
        nonlocal seen_free, seen_shared
        seen_free |= any(not p.deterministic for _, p in mix)
        prompts = [tuple(p) for p, _ in mix]
        seen_shared |= any(a[:2] == b[:2] and len(a) > 1 and len(b) > 1
                           for i, a in enumerate(prompts) for b in prompts[:i])

    look()
    assert seen_free and seen_shared


@given(policy=ls.fast_policies(min_scale=0.5, max_scale=3.0))
def test_fast_policies_are_fast_or_noisy_within_scale(policy):
    assert isinstance(policy, FastPolicy) and not policy.is_shape_closed
    if isinstance(policy, NoisyFastPolicy):
        assert 0.5 <= policy.scale <= 3.0


@given(policy=ls.fast_policies(allow_plain=False))
def test_fast_policies_can_be_noisy_only(policy):
    assert isinstance(policy, NoisyFastPolicy)


@given(data=st.data(), window=st.tuples(st.integers(1, 8), st.integers(0, 8)),
       group=st.tuples(st.integers(1, 4), st.integers(0, 4)))
def test_canonical_configs_respect_bounds(data, window, group):
    cfg = data.draw(ls.canonical_configs(min_window=window[0], max_window=sum(window),
                                         min_group=group[0], max_group=sum(group)))
    assert isinstance(cfg, CanonicalConfig)
    assert window[0] <= cfg.window <= sum(window) and group[0] <= cfg.group <= sum(group)


@given(cfg=ls.wide_model_configs(max_layers=2))
def test_wide_model_configs_are_valid_and_wide(cfg):
    assert isinstance(cfg, ModelConfig)
    assert cfg.hidden_size >= ls.MIN_WIDE_HIDDEN_SIZE
    assert 256 <= cfg.vocab_size <= 512 and 1 <= cfg.num_layers <= 2
    assert cfg.num_heads * cfg.head_dim == cfg.hidden_size and cfg.num_heads % cfg.num_kv_heads == 0
    assert cfg.attention_bias == (cfg.family == "qwen2") and cfg.qk_norm == (cfg.family == "qwen3")
    assert (cfg.sliding_window is not None) == (cfg.family == "mistral")


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral"])
def test_wide_model_config_builds_a_working_generator(family):
    cfg = ls.wide_model_config(vocab_size=256, num_layers=1, family=family)
    gen = DVRGenerator.from_config(cfg, weight_seed=0, window=2, group=2)
    out = gen.generate([[1, 2, 3]], SamplingParams(max_new_tokens=3, deterministic=True))[0]
    assert len(out.token_ids) == 3 and out.finish_reason == "length"


@settings(max_examples=15, deadline=None)
@given(knobs=ls.engine_knobs(max_num_seqs=4, max_fast_tokens=24, num_canonical_rows=8, num_layers=2),
       mix=ls.batch_mixes(vocab_size=KNOBS_CFG.vocab_size, max_size=4, max_prompt_len=14, max_new_tokens=9,
                          logprobs=True),
       policy=ls.fast_policies(max_scale=4.0))
def test_engine_knobs_build_generators_that_keep_the_contract(knobs, mix, policy):
    prompts, params = [p for p, _ in mix], [q for _, q in mix]
    gen = DVRGenerator(KNOBS_WEIGHTS, KNOBS_CFG, window=4, group=2, kv_cache_tokens=2048, block_size=8,
                       fast_policy=policy, **knobs)
    got = gen.generate(prompts, params)
    for prompt, q, c in zip(prompts, params, got):
        if q.deterministic:
            alone = _knobs_reference(tuple(prompt), q)
            assert (c.token_ids, c.logprobs) == (alone.token_ids, alone.logprobs), knobs


def test_engine_knobs_reach_every_knob_and_the_defaults():
    strategy = ls.engine_knobs(num_canonical_rows=8)
    assert find(strategy, lambda k: k.get("prompt_drafts", False) and k["scheduler"].order == "budget")
    assert find(strategy, lambda k: k["scheduler"].admission == "budget" and k["scheduler"].order == "arrival")
    assert find(strategy, lambda k: k["scheduler"].order == "canonical_budget" and k["scheduler"].age_bound)
    assert find(strategy, lambda k: not k["overlap"] and k["canonical_thread"] and k["risk_margin"] > 0)
    assert find(strategy, lambda k: k["max_canonical_tokens"] == 32 and k["mixed_steps"] is False)
    assert find(strategy, lambda k: not k["draft_ahead"] and "prompt_drafts" not in k)  # it needs draft_ahead
    assert find(strategy, lambda k: k["split_pass_steps"] and k["pass_before_read"] and k["canonical_thread"])
    assert find(strategy, lambda k: k["apply_before_read"] and k["pass_before_read"] and k["canonical_thread"])
    sliced = ls.engine_knobs(num_canonical_rows=8, num_layers=3)
    assert find(sliced, lambda k: k.get("canonical_slices") == 3 and k["pass_before_read"])
    assert find(sliced, lambda k: k["canonical_thread"] and "canonical_slices" not in k)  # refused together
    assert "canonical_slices" not in find(strategy, lambda k: True)
    assert find(strategy, lambda k: k["draft_ahead"] and k["overlap"] and not k["prompt_drafts"]
                and not k["adaptive_draft"] and k["prefix_cache"] and k["mixed_steps"] is None
                and not k["canonical_thread"] and k["risk_margin"] == 0 and k["max_canonical_tokens"] == 8
                and not k["split_pass_steps"] and not k["pass_before_read"] and not k["apply_before_read"]
                and k["scheduler"].order == "arrival" and not k["scheduler"].eager_verify)


@pytest.mark.parametrize("build", [
    lambda: ls.prompts(vocab_size=0),
    lambda: ls.prompts(vocab_size=10, min_len=5, max_len=4),
    lambda: ls.sampling_params(max_new_tokens=0),
    lambda: ls.sampling_params(min_new_tokens=3, max_new_tokens=2),
    lambda: ls.arrival_schedules(num_requests=0),
    lambda: ls.arrival_schedules(num_requests=2, max_gap=-1),
    lambda: ls.batch_mixes(vocab_size=10, max_size=1, min_deterministic=2),
    lambda: ls.fast_policies(min_scale=2.0, max_scale=1.0),
    lambda: ls.canonical_configs(min_window=0),
    lambda: ls.engine_knobs(max_fast_tokens=1),
    lambda: ls.engine_knobs(num_canonical_rows=0),
    lambda: ls.engine_knobs(num_layers=0),
    lambda: ls.wide_model_config(hidden_size=256),
    lambda: ls.wide_model_config(family="gpt2"),
])
def test_strategies_reject_bad_bounds_when_built(build):
    with pytest.raises(ValueError):
        build()


def test_strategies_are_keyword_only():
    with pytest.raises(TypeError):
        ls.prompts(10)  # type: ignore[misc]


def test_importing_llm42_testing_does_not_need_hypothesis():
    code = "import sys; sys.modules['hypothesis'] = None; import llm42.testing; llm42.testing.run_schedule"
    subprocess.run([sys.executable, "-c", code], check=True)


# -- assertion helpers -----------------------------------------------------------------------------
def _completion(tokens, logprobs=None, finish="length"):
    return Completion(request_id=0, prompt_token_ids=[1, 2], token_ids=list(tokens), finish_reason=finish,
                      logprobs=None if logprobs is None else list(logprobs))


def test_first_divergence_finds_the_first_difference():
    ref = _completion([5, 6, 7], [-1.0, -2.0, -3.0])
    assert first_divergence(ref, _completion([5, 6, 7], [-1.0, -2.0, -3.0])) is None
    token = first_divergence(ref, _completion([5, 9, 7], [-1.0, -2.5, -3.0]), index=3, schedule=(0, 1))
    assert (token.kind, token.position, token.reference_token, token.actual_token) == ("token", 1, 6, 9)
    assert (token.reference_logprob, token.actual_logprob) == (-2.0, -2.5)
    bits = first_divergence(ref, _completion([5, 6, 7], [-1.0, -2.0, math.nextafter(-3.0, 0.0)]))
    assert (bits.kind, bits.position) == ("logprob", 2)
    shorter = first_divergence(ref, _completion([5, 6], [-1.0, -2.0], finish="stop"))
    assert (shorter.kind, shorter.position, shorter.actual_token) == ("length", 2, None)
    assert first_divergence(ref, _completion([5, 6, 7])).kind == "logprobs_presence"
    assert first_divergence(ref, _completion([5, 6, 7], [-1.0, -2.0, -3.0], finish="stop")).kind == "finish_reason"
    message = token.describe()
    assert "request 3" in message and "(0, 1)" in message and "position 1" in message
    assert (-2.0).hex() in message and (-2.5).hex() in message


_TINY = ModelConfig(family="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1,
                    num_heads=2, num_kv_heads=1, head_dim=16, max_position_embeddings=32, rms_norm_eps=1e-5,
                    rope=RopeConfig(theta=10000.0))


@functools.cache
def _tiny_weights():
    return random_weights(_TINY, seed=0)


def _tiny_generator(fast_policy=None) -> DVRGenerator:
    """A tiny model: fast, and enough for the helpers' own logic (the wide model is for the properties)."""
    return DVRGenerator(_tiny_weights(), _TINY, window=3, group=2, fast_policy=fast_policy, kv_cache_tokens=256)


def test_run_schedule_submits_between_steps_and_returns_in_prompt_order():
    gen = _tiny_generator()
    seen: list[tuple[int, dict]] = []
    prompts = [[1, 2, 3], [4, 5], [6]]
    params = [SamplingParams(max_new_tokens=n) for n in (2, 3, 4)]
    out = run_schedule(gen, prompts, params, (3, 0, 0), on_step=lambda s, e: seen.append((s, e)))
    assert [c.prompt_token_ids for c in out] == prompts
    assert [len(c.token_ids) for c in out] == [2, 3, 4]
    rid_late = out[0].request_id
    # request 0 arrived before step 3: nothing of it before then
    assert all(rid_late not in events for step, events in seen if step < 3)
    assert any(rid_late in events for step, events in seen if step >= 3)
    with pytest.raises(ValueError):
        run_schedule(_tiny_generator(), prompts, params, (0, 0))


def test_run_schedule_idles_through_gaps():
    gen = _tiny_generator()
    out = run_schedule(gen, [[1], [2]], SamplingParams(max_new_tokens=1), (0, 10))
    assert [len(c.token_ids) for c in out] == [1, 1]


def test_assert_matches_reference_passes_for_deterministic_and_returns_the_runs():
    prompts = [[1, 2, 3, 4], [5, 6], [7, 8, 9]]
    params = [SamplingParams(max_new_tokens=5, deterministic=d, logprobs=True) for d in (True, False, True)]
    check = assert_matches_reference(lambda: _tiny_generator(NoisyFastPolicy(scale=3.0, seed=1)), prompts,
                                     params, schedules=[(0, 0, 0), (2, 0, 1)])
    assert check.indices == (0, 2) and set(check.references) == {0, 2}
    assert [run.schedule for run in check.runs] == [(0, 0, 0), (2, 0, 1)]
    assert all(len(run.completions) == 3 and "rollbacks" in run.stats for run in check.runs)
    assert check.num_rollbacks > 0 and not check.divergences


def test_assert_matches_reference_raises_with_details_on_divergence():
    prompts = [[1, 2, 3, 4], [5, 6], [7, 8, 9]]
    free = SamplingParams(max_new_tokens=6, logprobs=True)
    factory = lambda: _tiny_generator(NoisyFastPolicy(scale=3.0, seed=1))  # noqa: E731
    check = check_against_reference(factory, prompts, free, schedules=[(0, 0, 0)], indices=[0, 1, 2])
    assert check.divergences
    with pytest.raises(AssertionError) as failure:
        assert_matches_reference(factory, prompts, free, schedules=[(0, 0, 0)], indices=[0, 1, 2])
    first = check.divergences[0]
    message = str(failure.value)
    assert f"request {first.index} diverged" in message and "(0, 0, 0)" in message
    assert f"position {first.position}" in message
    assert f"token {first.reference_token}" in message and f"token {first.actual_token}" in message


def test_run_schedule_holds_follow_ups_until_their_request_finished():
    gen = _tiny_generator()
    base = list(range(3, 20))  # 17 tokens: one full K/V block (16) to share
    prompts = [base, base[:16] + [30, 31], [40, 41], [50]]
    params = SamplingParams(max_new_tokens=3, deterministic=True)
    events_at: dict[int, list[int]] = {}
    out = run_schedule(gen, prompts, params, (0, 0, 0, 0), after={1: 0, 3: 1},
                       on_step=lambda step, events: [events_at.setdefault(rid, []).append(step) for rid in events])
    assert [c.prompt_token_ids for c in out] == prompts
    first, last = ({c.request_id: f(events_at[c.request_id]) for c in out} for f in (min, max))
    assert first[out[1].request_id] > last[out[0].request_id]  # after request 0's last token
    assert first[out[3].request_id] > last[out[1].request_id]  # a chain: 3 after 1 after 0
    assert first[out[2].request_id] < last[out[0].request_id]  # not a follow-up: not held back
    # the follow-up found request 0's canonical K/V for the shared block in the prefix cache
    assert gen.stats["prefix_cached_tokens"] == 16


@pytest.mark.parametrize("after", [{0: 0}, {0: 1, 1: 0}, {0: 5}, {-1: 0}, {True: 0}])
def test_run_schedule_rejects_bad_follow_ups(after):
    with pytest.raises(ValueError, match="after"):
        run_schedule(_tiny_generator(), [[1], [2]], SamplingParams(max_new_tokens=1), (0, 0), after=after)


def test_check_against_reference_runs_follow_ups_in_every_schedule():
    prompts = [[1, 2, 3, 4], [1, 2, 5], [7, 8, 9]]
    params = SamplingParams(max_new_tokens=4, deterministic=True, logprobs=True)
    check = assert_matches_reference(_tiny_generator, prompts, params, schedules=[(0, 0, 0), (1, 0, 2)],
                                     after={1: 0})
    assert check.after == {1: 0} and not check.divergences
    free = SamplingParams(max_new_tokens=6, logprobs=True)
    noisy = check_against_reference(lambda: _tiny_generator(NoisyFastPolicy(scale=3.0, seed=1)), prompts, free,
                                    schedules=[(0, 0, 0)], indices=[0, 1, 2], after={1: 0})
    assert noisy.divergences and "request 1 after request 0" in noisy.report()


def test_assert_matches_reference_rejects_nothing_to_check():
    with pytest.raises(ValueError, match="deterministic"):
        assert_matches_reference(_tiny_generator, [[1]], SamplingParams(max_new_tokens=1))
    det = dataclasses.replace(SamplingParams(max_new_tokens=1), deterministic=True)
    with pytest.raises(ValueError, match="schedule"):
        assert_matches_reference(_tiny_generator, [[1]], det, schedules=[(0, 1)])
