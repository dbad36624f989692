"""Canonical K/V: a deterministic request's K/V at position p is a function of tokens[0..p] (and the
canonical config) alone — not of how its prompt was chunked, which windows were verified together, what
shared its canonical passes, or what the fast path wrote there before."""

from __future__ import annotations

import dataclasses

import torch
from hypothesis import given
from hypothesis import strategies as st

from llm42 import DVRGenerator, SamplingParams
from llm42.testing import first_divergence
from llm42.testing import strategies as ls
from llm42.verify import CanonicalConfig

from .schedulers import ChunkingScheduler, PerturbingScheduler

MAX_PROMPT_LEN = 24
MAX_EXTRA_POSITIONS = 8
MAX_NEW_TOKENS = 30  # long enough that the request is still running when its K/V is read


def kv_snapshot(gen: DVRGenerator, rid: int, num_positions: int) -> list[torch.Tensor]:
    """Copies of request ``rid``'s K and V at positions [0, num_positions), one tensor per layer and kind."""
    layers = gen.kv.layers()
    slots = torch.tensor(gen.kv.slots(rid, 0, num_positions))
    return [cache[slots].clone() for cache in (*layers.k, *layers.v)]


def _bits(t: torch.Tensor) -> torch.Tensor:
    # compare raw bytes: -0.0 vs 0.0 and NaN payloads count, as they would in a bitwise contract
    return t.contiguous().view(torch.uint8)


def same_bits(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(_bits(x), _bits(y)) for x, y in zip(a, b, strict=True))


def first_differing_position(a: list[torch.Tensor], b: list[torch.Tensor]) -> int | None:
    for pos in range(a[0].shape[0]):
        if any(not torch.equal(_bits(x[pos]), _bits(y[pos])) for x, y in zip(a, b)):
            return pos
    return None


def run_until_canonical(gen: DVRGenerator, prompts, params, schedule, *, target: int, num_positions: int,
                        max_steps: int = 2000) -> int:
    """Submit per ``schedule`` and step until ``num_positions`` K/V positions of request ``target`` are
    canonical; returns its request id."""
    rids: dict[int, int] = {}
    for step in range(max_steps):
        for i, arrival in enumerate(schedule):
            if arrival == step:
                rids[i] = gen.submit(prompts[i], params[i])
        rid = rids.get(target)
        if rid is not None and gen.kv.holds(rid) and gen.kv.num_canonical(rid) >= num_positions:
            return rid
        if rid is not None and gen.is_finished(rid):
            raise AssertionError(f"request finished before {num_positions} K/V positions were canonical")
        gen.step()
    raise AssertionError(f"{num_positions} K/V positions not canonical after {max_steps} steps")


@given(data=st.data())
def test_canonical_kv_is_independent_of_chunking_and_batch(wide_model, data):
    """K/V read mid-generation, alone vs among others with small or random prompt chunks, a drawn fast
    path and a request that shares a prefix with it: bit-identical over every canonical position."""
    vocab = wide_model.vocab_size
    canonical = data.draw(ls.canonical_configs(max_window=4, max_group=3), label="canonical")
    prompt = data.draw(ls.prompts(vocab_size=vocab, max_len=MAX_PROMPT_LEN), label="prompt")
    params = data.draw(ls.sampling_params(max_new_tokens=MAX_NEW_TOKENS, min_new_tokens=MAX_NEW_TOKENS,
                                          deterministic=True), label="params")
    params = dataclasses.replace(params, stop_token_ids=())  # keep it running
    num_positions = len(prompt) + data.draw(st.integers(0, MAX_EXTRA_POSITIONS), label="num_extra_positions")
    key_block = data.draw(st.sampled_from([64, 4, 16]), label="key_block")

    # reference: alone, default scheduler (prompt chunks as large as the pass allows), plain fast path,
    # canonical passes of R rows or wide ones (up to 512 rows: the whole prompt in one pass)
    is_wide = data.draw(st.booleans(), label="wide_reference")
    ref_gen = wide_model.factory(canonical, key_block=key_block,
                                 max_canonical_tokens=None if is_wide else canonical.num_rows)()
    ref_rid = run_until_canonical(ref_gen, [prompt], [params], (0,), target=0, num_positions=num_positions)
    reference = kv_snapshot(ref_gen, ref_rid, num_positions)

    # the same request among others, with its prompt chunked differently and a drawn fast path
    others = data.draw(ls.batch_mixes(vocab_size=vocab, min_deterministic=0, max_size=3,
                                      max_prompt_len=MAX_PROMPT_LEN, max_new_tokens=12), label="others")
    prompts = [prompt] + [p for p, _ in others]
    all_params = [params] + [q for _, q in others]
    if data.draw(st.booleans(), label="shares_prefix"):
        cut = data.draw(st.integers(1, len(prompt)), label="prefix_len")
        tail = data.draw(ls.prompts(vocab_size=vocab, max_len=8), label="tail")
        prompts.append(prompt[:cut] + tail)
        all_params.append(dataclasses.replace(params, max_new_tokens=8))
    schedule = data.draw(ls.arrival_schedules(num_requests=len(prompts)), label="schedule")
    chunk_sizes = data.draw(st.lists(st.integers(1, 8), min_size=1, max_size=4), label="chunk_sizes")
    perturb_seed = data.draw(st.none() | st.integers(0, 2**16), label="perturb_seed")
    scheduler = ChunkingScheduler(chunk_sizes) if perturb_seed is None else PerturbingScheduler(perturb_seed)
    policy = data.draw(ls.fast_policies(), label="fast_policy")
    gen = wide_model.factory(canonical, fast_policy=policy, scheduler=lambda: scheduler, key_block=key_block)()
    rid = run_until_canonical(gen, prompts, all_params, schedule, target=0, num_positions=num_positions)
    batched = kv_snapshot(gen, rid, num_positions)
    assert same_bits(reference, batched), (
        f"canonical K/V differs at position {first_differing_position(reference, batched)} "
        f"(prompt length {len(prompt)}, {num_positions} positions compared)"
    )

    # later fast steps, rollbacks and canonical passes never touch committed canonical K/V
    for _ in range(3):
        gen.step()
        if not gen.kv.holds(rid):
            break
        assert gen.kv.num_canonical(rid) >= num_positions
        assert same_bits(reference, kv_snapshot(gen, rid, num_positions))


def _fast_prefill_kv(wide_model, prompt: list[int], chunk_size: int) -> list[torch.Tensor]:
    gen = wide_model.factory(CanonicalConfig(window=2, group=2),
                             scheduler=lambda: ChunkingScheduler([chunk_size]))()
    rid = gen.submit(prompt, SamplingParams(max_new_tokens=4))
    while not (gen.kv.holds(rid) and gen.kv.num_tokens(rid) >= len(prompt)):
        gen.step()
    return kv_snapshot(gen, rid, len(prompt))


def test_negative_control_fast_path_kv_depends_on_chunking(wide_model):
    """Without the canonical pass (deterministic=False: prompt prefilled on the fast path), the K/V of the
    same prompt depends on how it was chunked. The bitwise comparison above would catch that."""
    prompt = [(7 * i + 3) % wide_model.vocab_size for i in range(MAX_PROMPT_LEN)]
    snapshots = [_fast_prefill_kv(wide_model, prompt, size) for size in (MAX_PROMPT_LEN, 7, 3, 1)]
    distinct = [s for i, s in enumerate(snapshots) if all(not same_bits(s, t) for t in snapshots[:i])]
    assert len(distinct) >= 2, "fast-path K/V was identical for every chunking: the K/V check proves nothing"


@given(data=st.data())
def test_prefix_cache_reuse_across_turns_matches_a_fresh_generator(wide_model, data):
    """Turn 2 extends turn 1's prompt and output, so it reuses turn 1's canonical K/V from the prefix
    cache (and so may a request sharing part of the prompt): its output equals a cold generator's."""
    vocab = wide_model.vocab_size
    canonical = data.draw(ls.canonical_configs(max_window=4, max_group=3), label="canonical")
    block_size = data.draw(st.sampled_from([2, 4, 8]), label="block_size")
    first = data.draw(ls.prompts(vocab_size=vocab, max_len=16), label="first_prompt")
    params = data.draw(ls.sampling_params(max_new_tokens=12, deterministic=True, logprobs=True),
                       label="params")
    policy = data.draw(ls.fast_policies(), label="fast_policy")
    gen = wide_model.factory(canonical, fast_policy=policy, block_size=block_size)()
    turn1 = gen.generate([first], params)[0]

    second = first + turn1.token_ids + data.draw(ls.prompts(vocab_size=vocab, max_len=8), label="continuation")
    sibling = first[: data.draw(st.integers(1, len(first)), label="sibling_cut")] + [0, 1]
    turn2, _ = gen.generate([second, sibling], [params, dataclasses.replace(params, max_new_tokens=4)])
    if len(first) + len(turn1.token_ids) > block_size:  # at least one full canonical block to reuse
        assert gen.stats["prefix_cached_tokens"] > 0

    cold = wide_model.factory(canonical, prefix_cache=False)().generate([second], params)[0]
    divergence = first_divergence(cold, turn2)
    assert divergence is None, divergence.describe()


def test_negative_control_fast_path_kv_is_never_cached(wide_model):
    """Fast-path K/V drifts with the batch (see above), so it must never enter the prefix cache: a free
    request's turn leaves nothing for the next turn to reuse, while a deterministic one does."""
    prompt = [(5 * i + 1) % wide_model.vocab_size for i in range(20)]
    for deterministic, expect_hit in ((False, False), (True, True)):
        gen = wide_model.factory(CanonicalConfig(window=4, group=2), block_size=4)()
        params = SamplingParams(max_new_tokens=6, deterministic=deterministic)
        turn1 = gen.generate([prompt], params)[0]
        gen.generate([prompt + turn1.token_ids + [3]], params)
        assert (gen.stats["prefix_cached_tokens"] > 0) is expect_hit
