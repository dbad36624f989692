"""The contract: a deterministic request's committed tokens and log-probs are its batch-size-1 reference's.

Drawn: prompts (with shared prefixes), greedy and seeded top-k/top-p sampling,
stop ids, logprobs on/off, window/group, arrival schedules, batch mixes of
deterministic and free requests, the default or a perturbing scheduler, and the
plain or a noisy fast path. The reference always runs with the plain fast path
and the default scheduler, so agreement also shows that committed output does
not depend on either. The negative controls (drift is detected when
verification is off) are in test_negative_control.py.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from hypothesis import event, given
from hypothesis import strategies as st

from llm42 import SamplingParams
from llm42.policies import NoisyFastPolicy
from llm42.testing import assert_matches_reference, first_divergence, run_schedule
from llm42.testing import strategies as ls
from llm42.verify import CanonicalConfig

from .schedulers import make_scheduler

MAX_NEW_TOKENS = 12
MAX_PROMPT_LEN = 24
# On this CPU a GEMM gives a row one result for M = 1, another for M = 2..15 and a third for M >= 16.
# Small R keeps examples fast; R >= 16 puts the canonical pass in another class than most of its passes'
# real row counts, so a pass whose shape followed its real rows could not hide.
CANONICAL_CONFIGS = ls.canonical_configs(max_window=4, max_group=3) | st.sampled_from(
    [CanonicalConfig(window=8, group=2), CanonicalConfig(window=4, group=5)])


def test_cpu_gemms_drift_with_batch_size(wide_model):
    """The same row times the same weight gives different bits for different M: the contract is not free."""
    x = torch.randn(32, wide_model.cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    layer = wide_model.weights.layers[0]
    distinct = {}
    for name, weight in (("qkv", layer.qkv), ("gate_up", layer.gate_up), ("lm_head", wide_model.weights.lm_head)):
        results = {F.linear(x[:m], weight)[0].numpy().tobytes() for m in range(1, 33)}
        distinct[name] = len(results)
    assert max(distinct.values()) >= 2, f"no GEMM drift across batch sizes 1..32: {distinct}"


@given(data=st.data())
def test_deterministic_requests_match_batch_size_1_reference(wide_model, data):
    """The contract itself, over everything a run may vary: arrival order and timing, batch mix,
    admission limits, scheduler, fast path, K/V page size and prefix-cache hits, and the canonical
    attention's key block (the reference shares the canonical config: window, group and key block)."""
    canonical = data.draw(CANONICAL_CONFIGS, label="canonical")
    mix = data.draw(ls.batch_mixes(vocab_size=wide_model.vocab_size, max_size=4, max_prompt_len=MAX_PROMPT_LEN,
                                   max_new_tokens=MAX_NEW_TOKENS), label="mix")
    policy = data.draw(ls.fast_policies(min_scale=0.5), label="fast_policy")
    scheduler_kind = data.draw(st.sampled_from(["default", "perturbing"]), label="scheduler")
    scheduler_seed = data.draw(st.integers(0, 2**16), label="scheduler_seed")
    # admission limits make requests queue, so they start (and share passes) at other times
    max_num_seqs = data.draw(st.sampled_from([256, 1, 2]), label="max_num_seqs")
    kv_cache_tokens = data.draw(st.sampled_from([1024, MAX_PROMPT_LEN + MAX_NEW_TOKENS]), label="kv_cache_tokens")
    # small key blocks: how many blocks a pass loops over depends on the other rows' context lengths
    key_block = data.draw(st.sampled_from([64, 4, 16]), label="key_block")
    # small K/V pages: shared prompt prefixes hit the prefix cache (the reference never does)
    block_size = data.draw(st.sampled_from([16, 4]), label="block_size")
    # adaptive speculation depth: drafts and verifies at other times, commits the same tokens
    adaptive_draft = data.draw(st.booleans(), label="adaptive_draft")
    schedules = data.draw(st.lists(ls.arrival_schedules(num_requests=len(mix), max_gap=4), min_size=1,
                                   max_size=3), label="schedules")
    prompts = [p for p, _ in mix]
    params = [q for _, q in mix]
    factory = wide_model.factory(
        canonical, fast_policy=policy, scheduler=lambda: make_scheduler(scheduler_kind, scheduler_seed),
        max_num_seqs=max_num_seqs, kv_cache_tokens=kv_cache_tokens, key_block=key_block, block_size=block_size,
        adaptive_draft=adaptive_draft,
    )
    check = assert_matches_reference(factory, prompts, params, schedules=schedules,
                                     reference_factory=wide_model.factory(canonical, key_block=key_block))
    event(f"rolled back: {check.num_rollbacks > 0}")
    event(f"sampled deterministic request: {any(p.deterministic and not p.is_greedy for p in params)}")
    event(f"free requests: {sum(not p.deterministic for p in params)}")
    event(f"prefix cache hit: {any(run.stats['prefix_cached_tokens'] > 0 for run in check.runs)}")


@given(data=st.data())
def test_contract_holds_for_every_family_up_to_the_context_limit(family_models, data):
    """Each family's extra ops (q/k/v bias, q/k norm, a sliding window shorter than the prompt), with
    prompts and outputs that run up to the model's last position."""
    model = family_models[data.draw(st.sampled_from(sorted(family_models)), label="family")]
    context = model.cfg.max_position_embeddings
    canonical = data.draw(ls.canonical_configs(max_window=4, max_group=2), label="canonical")
    mix = data.draw(ls.batch_mixes(vocab_size=model.vocab_size, max_size=3, max_prompt_len=context - 8,
                                   max_new_tokens=8), label="mix")
    prompts = [p for p, _ in mix]
    # a drawn request is stretched to end exactly at the context limit
    longest = data.draw(st.integers(0, len(mix) - 1), label="at_limit")
    params = [dataclasses.replace(q, max_new_tokens=context - len(p)) if i == longest else q
              for i, (p, q) in enumerate(mix)]
    schedule = data.draw(ls.arrival_schedules(num_requests=len(mix)), label="schedule")
    policy = data.draw(ls.fast_policies(), label="fast_policy")
    assert_matches_reference(model.factory(canonical, fast_policy=policy, key_block=16), prompts, params,
                             schedules=[schedule], reference_factory=model.factory(canonical, key_block=16))


@given(data=st.data())
def test_greedy_output_is_independent_of_the_fast_path(wide_model, data):
    """Noisy candidates are rolled back, and what is committed equals the plain fast path's output."""
    vocab = wide_model.vocab_size
    canonical = data.draw(ls.canonical_configs(min_window=2, max_window=4, max_group=3), label="canonical")
    det = data.draw(st.lists(st.tuples(
        ls.prompts(vocab_size=vocab, max_len=MAX_PROMPT_LEN),
        ls.sampling_params(min_new_tokens=4, max_new_tokens=MAX_NEW_TOKENS, deterministic=True,
                           allow_sampling=False, logprobs=True),
    ), min_size=1, max_size=3), label="deterministic")
    free = data.draw(st.lists(st.tuples(
        ls.prompts(vocab_size=vocab, max_len=MAX_PROMPT_LEN),
        ls.sampling_params(max_new_tokens=MAX_NEW_TOKENS, deterministic=False, vocab_size=vocab),
    ), max_size=2), label="free")
    mix = det + free
    schedule = data.draw(ls.arrival_schedules(num_requests=len(mix)), label="schedule")
    noisy = NoisyFastPolicy(scale=data.draw(st.floats(2.0, 8.0), label="scale"),
                            seed=data.draw(st.integers(0, 2**31 - 1), label="noise_seed"))
    prompts = [p for p, _ in mix]
    params = [q for _, q in mix]

    plain_out = run_schedule(wide_model.factory(canonical)(), prompts, params, schedule)
    noisy_gen = wide_model.factory(canonical, fast_policy=noisy)()
    noisy_out = run_schedule(noisy_gen, prompts, params, schedule)

    for i in range(len(det)):
        divergence = first_divergence(plain_out[i], noisy_out[i], index=i, schedule=schedule)
        assert divergence is None, divergence.describe()
    stats = noisy_gen.stats
    assert stats["rollbacks"] > 0, f"the noisy fast path never caused a rollback: {stats}"
    assert stats["rollbacks"] == sum(c.num_rollbacks for c in noisy_out)
    assert stats["recomputed_tokens"] == sum(c.num_recomputed for c in noisy_out)
    assert stats["committed_tokens"] == sum(len(c.token_ids) for c in noisy_out)
    for c, p in zip(noisy_out, params):
        if p.deterministic:
            assert c.num_recomputed >= c.num_rollbacks
        else:
            assert (c.num_rollbacks, c.num_recomputed) == (0, 0)
    assert stats["accepted_tokens"] + stats["recomputed_tokens"] <= stats["fast_tokens"]


@given(data=st.data())
def test_stop_tokens_act_on_committed_tokens_only(wide_model, data):
    """A stop id ends a deterministic request exactly where its reference first commits it, however noisy
    the candidates (a candidate equal to the stop id must not end the request)."""
    vocab = wide_model.vocab_size
    canonical = data.draw(ls.canonical_configs(min_window=2, max_window=4, max_group=3), label="canonical")
    prompt = data.draw(ls.prompts(vocab_size=vocab, max_len=MAX_PROMPT_LEN), label="prompt")
    params = data.draw(ls.sampling_params(min_new_tokens=2, max_new_tokens=MAX_NEW_TOKENS, deterministic=True,
                                          logprobs=True), label="params")
    params = dataclasses.replace(params, stop_token_ids=())
    reference = wide_model.factory(canonical)().generate([prompt], params)[0]
    stop_id = reference.token_ids[data.draw(st.integers(0, len(reference.token_ids) - 1), label="stop_at")]
    cut = reference.token_ids.index(stop_id) + 1

    stopping = dataclasses.replace(params, stop_token_ids=(stop_id,))
    others = data.draw(ls.batch_mixes(vocab_size=vocab, min_deterministic=0, max_size=3,
                                      max_prompt_len=MAX_PROMPT_LEN, max_new_tokens=MAX_NEW_TOKENS), label="others")
    prompts = [prompt] + [p for p, _ in others]
    all_params = [stopping] + [q for _, q in others]
    schedule = data.draw(ls.arrival_schedules(num_requests=len(prompts)), label="schedule")
    noisy = NoisyFastPolicy(scale=4.0, seed=data.draw(st.integers(0, 2**31 - 1), label="noise_seed"))
    out = run_schedule(wide_model.factory(canonical, fast_policy=noisy)(), prompts, all_params, schedule)[0]

    assert out.token_ids == reference.token_ids[:cut]
    assert [x.hex() for x in out.logprobs] == [x.hex() for x in reference.logprobs[:cut]]
    assert out.finish_reason == "stop"


def test_logprobs_flag_does_not_change_tokens(wide_model):
    """Asking for log-probs is observation only: the committed tokens are the same with and without."""
    factory = wide_model.factory(CanonicalConfig(window=3, group=2), fast_policy=NoisyFastPolicy(scale=3.0))
    prompt = list(range(5, 25))
    with_lp = SamplingParams(max_new_tokens=10, deterministic=True, temperature=0.7, seed=3, logprobs=True)
    without = dataclasses.replace(with_lp, logprobs=False)
    a, b = factory().generate([prompt, prompt], [with_lp, without])
    assert a.token_ids == b.token_ids
    assert b.logprobs is None and len(a.logprobs) == len(a.token_ids)
