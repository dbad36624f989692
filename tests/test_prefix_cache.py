"""The prefix cache reuses canonical K/V across requests and turns without changing a bit
(invariant 3: canonical K/V at position p is a function of tokens[0..p] alone)."""

import random

from llm42 import DVRGenerator, KVStore, SamplingParams
from llm42.model.weights import random_weights
from llm42.policies import NoisyFastPolicy
from tests.helpers import tiny_config, wide_config

CFG = wide_config(num_layers=1, vocab_size=256)
WEIGHTS = random_weights(CFG, seed=21, lm_head_std=0.05)
DET = SamplingParams(max_new_tokens=12, deterministic=True, logprobs=True)


def make(**kwargs):
    return DVRGenerator(WEIGHTS, CFG, window=4, group=2, block_size=4, **kwargs)


def prompt(seed, n):
    rng = random.Random(seed)
    return [rng.randrange(3, CFG.vocab_size) for _ in range(n)]


def test_repeated_prompt_reuses_canonical_blocks_bit_exact():
    p = prompt(1, 23)
    reference = make(prefix_cache=False).generate([p], DET)[0]
    gen = make(fast_policy=NoisyFastPolicy(scale=1.0, seed=2))
    first = gen.generate([p], DET)[0]
    assert gen.stats["prefix_cached_tokens"] == 0
    second = gen.generate([p], DET)[0]
    assert gen.stats["prefix_cached_tokens"] == 20  # 5 full blocks of 4 within the first 22 tokens
    for out in (first, second):
        assert out.token_ids == reference.token_ids and out.logprobs == reference.logprobs


def test_next_turn_reuses_the_previous_answer_bit_exact():
    turn1 = prompt(2, 9)
    gen = make()
    answer = gen.generate([turn1], DET)[0]
    turn2 = turn1 + answer.token_ids + prompt(3, 5)
    cached_before = gen.stats["prefix_cached_tokens"]
    follow_up = gen.generate([turn2], DET)[0]
    reused = gen.stats["prefix_cached_tokens"] - cached_before
    assert reused >= 16, "blocks covering the first turn's answer should be reused"
    reference = make(prefix_cache=False).generate([turn2], DET)[0]
    assert follow_up.token_ids == reference.token_ids and follow_up.logprobs == reference.logprobs


def test_concurrent_requests_sharing_a_prefix_match_their_references():
    stem = prompt(4, 16)
    prompts = [stem + prompt(10 + i, 1 + i) for i in range(5)]
    refs = [make(prefix_cache=False).generate([p], DET)[0] for p in prompts]
    gen = make()
    gen.generate([prompts[0]], DET)  # warm the cache with the stem
    outs = gen.generate(prompts, DET)
    assert gen.stats["prefix_cached_tokens"] >= 5 * 12
    for out, ref in zip(outs, refs):
        assert out.token_ids == ref.token_ids and out.logprobs == ref.logprobs


def test_cache_eviction_under_memory_pressure_keeps_outputs_exact():
    gen = make(kv_cache_tokens=64)  # 16 blocks of 4: every new prompt evicts older cached blocks
    for i in range(6):
        p = prompt(100 + i, 20)
        out = gen.generate([p], DET)[0]
        ref = make(prefix_cache=False).generate([p], DET)[0]
        assert out.token_ids == ref.token_ids
        kv = gen.kv
        assert kv.num_free_blocks + kv.num_cached_blocks + kv.num_used_blocks == kv.num_blocks
    again = gen.generate([prompt(105, 20)], DET)[0]  # the most recent prompt is still cached
    assert again.token_ids == make(prefix_cache=False).generate([prompt(105, 20)], DET)[0].token_ids


def test_kv_store_index_chains_and_evicts_descendants():
    kv = KVStore(tiny_config(), num_blocks=3, block_size=2, num_scratch_slots=2)
    tokens = [5, 6, 7, 8, 9, 10]
    kv.allocate(0, 6)
    kv.append(0, 6)
    kv.mark_canonical(0, 6)
    kv.publish(0, tokens)
    table = kv.block_table(0)
    assert kv.match_prefix(tokens) == table
    assert kv.match_prefix([5, 6, 7, 99]) == table[:1]
    assert kv.match_prefix([1, 6, 7, 8]) == []
    kv.free(0)
    assert kv.num_cached_blocks == 3 and kv.num_free_blocks == 0
    # free() releases the leaf first, so the leaf is the first evicted and the chain keeps its root
    kv.allocate(1, 2)
    kv.append(1, 2)
    assert kv.match_prefix(tokens) == table[:2]
    kv.free(1)
    # evicting the root takes every descendant out of the index
    kv.allocate(2, 6)
    kv.append(2, 6)
    assert kv.match_prefix(tokens) == []
    assert kv.num_used_blocks == 3
