"""The contract: a deterministic request's committed tokens and log-probs are its batch-size-1 reference's.

Drawn: prompts (with shared prefixes), greedy and seeded top-k/top-p sampling,
stop ids, window/group, arrival schedules, batch mixes of deterministic and
free requests, the default or a perturbing scheduler, the plain or a noisy
fast path, and canonical passes inline or on a worker thread. Deterministic requests always ask for log-probs, compared bit for
bit: on the suite's model plain CPU drift changes log-prob bits, hardly ever a
token. What the properties must exercise is asserted, not only counted: every
run of the noisy variant rolls back, and a follow-up request that shares a K/V
block with a finished one hits the prefix cache. The reference always runs
with the plain fast path and the default scheduler, so agreement also shows
that committed output does not depend on either. The negative controls (drift
is detected when verification is off) are in test_negative_control.py; the
mutation controls (a broken canonical pass or commit rule makes these
properties fail) in test_mutation_controls.py.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from hypothesis import event, given
from hypothesis import strategies as st

from llm42 import SamplingParams
from llm42.policies import NoisyFastPolicy
from llm42.testing import ReferenceCheck, assert_matches_reference, check_against_reference, first_divergence
from llm42.testing import run_schedule
from llm42.testing import strategies as ls
from llm42.verify import CanonicalConfig

from .mutations import Mutation
from .schedulers import SCHEDULER_KINDS, make_scheduler

MAX_NEW_TOKENS = 12
MAX_PROMPT_LEN = 24
# On this CPU a GEMM gives a row one result for M = 1, another for M = 2..15 and a third for M >= 16.
# Small R keeps examples fast; R >= 16 puts the canonical pass in another class than most of its passes'
# real row counts, so a pass whose shape followed its real rows could not hide.
_WIDE_CONFIGS = st.sampled_from([CanonicalConfig(window=8, group=2), CanonicalConfig(window=4, group=5)])
CANONICAL_CONFIGS = ls.canonical_configs(max_window=4, max_group=3) | _WIDE_CONFIGS
NOISY_CANONICAL_CONFIGS = ls.canonical_configs(min_window=2, max_window=4, max_group=3) | _WIDE_CONFIGS  # drafts


def test_cpu_gemms_drift_with_batch_size(wide_model):
    """The same row times the same weight gives different bits for different M: the contract is not free."""
    x = torch.randn(32, wide_model.cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    layer = wide_model.weights.layers[0]
    distinct = {}
    for name, weight in (("qkv", layer.qkv), ("gate_up", layer.gate_up), ("lm_head", wide_model.weights.lm_head)):
        results = {F.linear(x[:m], weight)[0].numpy().tobytes() for m in range(1, 33)}
        distinct[name] = len(results)
    assert max(distinct.values()) >= 2, f"no GEMM drift across batch sizes 1..32: {distinct}"


@dataclass(frozen=True)
class ContractExample:
    """One drawn example of the contract property, run: the check and what it was sure to exercise."""

    check: ReferenceCheck
    params: list[SamplingParams]
    is_prefix_hit_certain: bool  # no cached block can have been evicted before the follow-up was admitted


def _follow_up(data, mix, *, vocab_size: int, block_size: int):
    """A deterministic follow-up of a drawn deterministic request of ``mix``: its prompt starts with at least
    one full K/V block of that request's prompt, so once the request has finished the follow-up finds that
    block's canonical K/V in the prefix cache. Returns (mix with the request's prompt stretched to more than
    one block if needed, the follow-up, the request's index)."""
    base = data.draw(st.sampled_from([i for i, (_, q) in enumerate(mix) if q.deterministic]), label="follow_up_of")
    prompt, params = mix[base]
    if len(prompt) <= block_size:  # one full block to share, and a last prompt token of its own
        prompt = prompt + data.draw(st.lists(st.integers(0, vocab_size - 1), min_size=block_size + 1 - len(prompt),
                                             max_size=MAX_PROMPT_LEN - len(prompt)), label="stretch")
        mix = [*mix[:base], (prompt, params), *mix[base + 1:]]
    cut = data.draw(st.integers(block_size, len(prompt)), label="shared_len")
    tail = data.draw(st.lists(st.integers(0, vocab_size - 1), min_size=max(0, block_size + 1 - cut),
                              max_size=MAX_PROMPT_LEN - cut), label="follow_up_tail")
    follow_params = data.draw(ls.sampling_params(max_new_tokens=MAX_NEW_TOKENS, deterministic=True, logprobs=True,
                                                 vocab_size=vocab_size), label="follow_up_params")
    return mix, (prompt[:cut] + tail, follow_params), base


def contract_example(model, data, *, is_noisy: bool, mutation: Mutation | None = None) -> ContractExample:
    """Draw and run one example of the contract: deterministic requests (log-probs on) among free ones,
    plus a follow-up that reuses a finished request's prefix, against their batch-size-1 references.

    ``is_noisy``: the fast path is noisy enough that every candidate is wrong (the plain one or a milder
    noisy one otherwise), and one deterministic request drafts several candidates: every run rolls back.
    ``mutation`` swaps the canonical pass or commit rule for a broken one, in the runs and the references.
    """
    vocab = model.vocab_size
    canonical = data.draw(NOISY_CANONICAL_CONFIGS if is_noisy else CANONICAL_CONFIGS, label="canonical")
    # small K/V pages: shared prompt prefixes hit the prefix cache (the reference never does)
    block_size = data.draw(st.sampled_from([16, 4]), label="block_size")
    mix = data.draw(ls.batch_mixes(vocab_size=vocab, max_size=4, max_prompt_len=MAX_PROMPT_LEN,
                                   max_new_tokens=MAX_NEW_TOKENS, logprobs=True), label="mix")
    mix, follow_up, base = _follow_up(data, mix, vocab_size=vocab, block_size=block_size)
    mix.append(follow_up)
    if is_noisy:
        policy = NoisyFastPolicy(scale=data.draw(st.floats(16.0, 1024.0), label="noise_scale"),
                                 seed=data.draw(st.integers(0, 2**31 - 1), label="noise_seed"))
        # with a window of 2 or more, 8 tokens without a stop draft at least 3 candidates, all wrong
        drafter = data.draw(st.sampled_from([i for i, (_, q) in enumerate(mix) if q.deterministic]), label="drafter")
        prompt, q = mix[drafter]
        mix[drafter] = (prompt, dataclasses.replace(q, max_new_tokens=max(q.max_new_tokens, 8), stop_token_ids=()))
    else:
        policy = data.draw(ls.fast_policies(min_scale=0.5), label="fast_policy")
    # the budget order only where no mutation is drawn: the mutation controls' examples stay as they were
    kinds = SCHEDULER_KINDS if mutation is None else SCHEDULER_KINDS[:2]
    scheduler_kind = data.draw(st.sampled_from(kinds), label="scheduler")
    scheduler_seed = data.draw(st.integers(0, 2**16), label="scheduler_seed")
    # admission limits make requests queue, so they start (and share passes) at other times
    max_num_seqs = data.draw(st.sampled_from([256, 1, 2]), label="max_num_seqs")
    kv_cache_tokens = data.draw(st.sampled_from([1024, MAX_PROMPT_LEN + MAX_NEW_TOKENS]), label="kv_cache_tokens")
    # small key blocks: how many blocks a pass loops over depends on the other rows' context lengths
    key_block = data.draw(st.sampled_from([64, 4, 16]), label="key_block")
    # adaptive speculation depth: drafts and verifies at other times, commits the same tokens
    adaptive_draft = data.draw(st.booleans(), label="adaptive_draft")
    # passes on a worker thread, applied whenever they are done: later and at other steps than inline
    canonical_thread = data.draw(st.booleans(), label="canonical_thread")
    # decode rows and free prompt chunks in one forward pass (the CUDA default): other fast-path batches.
    # Not drawn under a mutation: the mutation controls' examples (and their sensitivity) stay as they were
    mixed_steps = data.draw(st.booleans(), label="mixed_steps") if mutation is None else False
    # passes applied some steps after their launch, as on a busy GPU: deterministic requests draft ahead of
    # their windows meanwhile (kept or dropped by the commit). Not drawn under a mutation, as mixed_steps
    pass_lag = data.draw(st.sampled_from([0, 1, 3]), label="pass_lag") if mutation is None else 0
    schedules = data.draw(st.lists(ls.arrival_schedules(num_requests=len(mix), max_gap=4), min_size=1,
                                   max_size=3), label="schedules")
    prompts = [p for p, _ in mix]
    params = [q for _, q in mix]
    verifier = None if mutation is None else functools.partial(mutation, model, canonical, key_block)
    factory = model.factory(
        canonical, fast_policy=policy, scheduler=lambda: make_scheduler(scheduler_kind, scheduler_seed),
        max_num_seqs=max_num_seqs, kv_cache_tokens=kv_cache_tokens, key_block=key_block, block_size=block_size,
        adaptive_draft=adaptive_draft, canonical_thread=canonical_thread, verifier=verifier,
        mixed_steps=mixed_steps, pass_lag=pass_lag,
    )
    check = check_against_reference(factory, prompts, params, schedules=schedules, after={len(mix) - 1: base},
                                    reference_factory=model.factory(canonical, key_block=key_block,
                                                                    verifier=verifier))
    # with room for every request at once, no admission ever evicts a cached block
    num_blocks = sum(-(-(len(p) + q.max_new_tokens) // block_size) for p, q in mix)
    return ContractExample(check, params, is_prefix_hit_certain=num_blocks * block_size <= kv_cache_tokens)


def _assert_contract(example: ContractExample) -> None:
    check = example.check
    assert not check.divergences, check.report()
    if example.is_prefix_hit_certain:
        for run in check.runs:
            assert run.stats["prefix_cached_tokens"] > 0, f"the follow-up missed the prefix cache: {run.stats}"
    event(f"prefix cache hit certain: {example.is_prefix_hit_certain}")
    event(f"prefix cache hit in every run: {all(run.stats['prefix_cached_tokens'] > 0 for run in check.runs)}")
    event(f"rolled back in every run: {all(run.stats['rollbacks'] > 0 for run in check.runs)}")
    event(f"sampled deterministic request: {any(p.deterministic and not p.is_greedy for p in example.params)}")
    event(f"free requests: {sum(not p.deterministic for p in example.params)}")
    event(f"drafts ahead kept in a run: {any(run.stats['ahead_tokens_kept'] > 0 for run in example.check.runs)}")


@given(data=st.data())
def test_deterministic_requests_match_batch_size_1_reference(wide_model, data):
    """The contract itself, over everything a run may vary: arrival order and timing, batch mix,
    admission limits, scheduler, fast path, K/V page size, prefix-cache hits (required: a follow-up arrives
    once a request it shares a block with has finished), and the canonical attention's key block (the
    reference shares the canonical config: window, group and key block). Log-probs are compared bit for
    bit: on this model plain CPU drift changes their bits, hardly ever a token."""
    _assert_contract(contract_example(wide_model, data, is_noisy=False))


@given(data=st.data())
def test_rolled_back_requests_match_batch_size_1_reference(wide_model, data):
    """The contract through rollbacks, required in every run: a fast path so noisy that every candidate is
    wrong, and a request that drafts several, so the committed output is the canonical pass's alone."""
    example = contract_example(wide_model, data, is_noisy=True)
    _assert_contract(example)
    for run in example.check.runs:
        assert run.stats["rollbacks"] > 0, f"the noisy fast path caused no rollback: {run.stats}"


@given(data=st.data())
def test_contract_holds_for_every_family_up_to_the_context_limit(family_models, data):
    """Each family's extra ops (q/k/v bias, q/k norm, a sliding window shorter than the prompt), with
    prompts and outputs that run up to the model's last position."""
    model = family_models[data.draw(st.sampled_from(sorted(family_models)), label="family")]
    context = model.cfg.max_position_embeddings
    canonical = data.draw(ls.canonical_configs(max_window=4, max_group=2), label="canonical")
    mix = data.draw(ls.batch_mixes(vocab_size=model.vocab_size, max_size=3, max_prompt_len=context - 8,
                                   max_new_tokens=8, logprobs=True), label="mix")
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
    """Noisy candidates are rolled back, and what is committed equals the plain fast path's output.

    The rollbacks are certain on any machine: at 16 or more logit std-devs of noise a candidate is about a
    uniform draw from the vocabulary, and each deterministic request drafts at least 3 of them (8 or more
    tokens, no stop ids, windows of 2 or more)."""
    vocab = wide_model.vocab_size
    canonical = data.draw(ls.canonical_configs(min_window=2, max_window=4, max_group=3), label="canonical")
    det = data.draw(st.lists(st.tuples(
        ls.prompts(vocab_size=vocab, max_len=MAX_PROMPT_LEN),
        ls.sampling_params(min_new_tokens=8, max_new_tokens=MAX_NEW_TOKENS, deterministic=True,
                           allow_sampling=False, logprobs=True),
    ), min_size=1, max_size=3), label="deterministic")
    free = data.draw(st.lists(st.tuples(
        ls.prompts(vocab_size=vocab, max_len=MAX_PROMPT_LEN),
        ls.sampling_params(max_new_tokens=MAX_NEW_TOKENS, deterministic=False, vocab_size=vocab),
    ), max_size=2), label="free")
    mix = det + free
    schedule = data.draw(ls.arrival_schedules(num_requests=len(mix)), label="schedule")
    noisy = NoisyFastPolicy(scale=data.draw(st.floats(16.0, 64.0), label="scale"),
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
