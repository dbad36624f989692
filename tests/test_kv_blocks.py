"""The K/V store's parts apart: block accounting, the prefix index, the tensors, and the protocol's reach."""

import pytest
import torch

from llm42 import DVRGenerator, KVStore, KVStoreProtocol, SamplingParams
from llm42.kv.prefix import PrefixIndex
from llm42.kv.tensors import KVTensors
from llm42.model.weights import random_weights
from llm42.policies import NoisyFastPolicy
from tests.helpers import tiny_config

CFG = tiny_config(num_layers=1)


def store(num_blocks=4, block_size=2, **kwargs):
    return KVStore(CFG, num_blocks=num_blocks, block_size=block_size, num_scratch_slots=2, **kwargs)


def assert_blocks_add_up(kv):
    assert kv.num_free_blocks + kv.num_cached_blocks + kv.num_used_blocks == kv.num_blocks
    assert kv.num_unreserved_blocks >= 0


def held(kv, rid, tokens, *, max_tokens=None):
    """Admit ``rid``, write ``tokens`` canonically and publish them."""
    kv.allocate(rid, max_tokens or len(tokens))
    kv.append(rid, len(tokens))
    kv.mark_canonical(rid, len(tokens))
    kv.publish(rid, tokens)
    return kv.block_table(rid)


# -- block accounting -------------------------------------------------------------------------------
def test_reservation_is_taken_lazily_and_given_back_by_truncate_and_free():
    kv = store(num_blocks=4)
    kv.allocate(0, 7)  # 4 blocks reserved, none taken yet
    assert kv.num_used_blocks == 0 and kv.num_unreserved_blocks == 0
    assert not kv.can_allocate(1)
    kv.append(0, 3)
    assert kv.block_table(0) == [0, 1] and kv.num_tokens(0) == 3
    assert kv.slots(0, 1, 3) == [1, 2]
    kv.append(0, 7)
    assert kv.num_used_blocks == 4 and kv.num_free_blocks == 0
    assert_blocks_add_up(kv)
    kv.truncate(0, 2)  # the tail's blocks go back to the free list, still reserved for request 0
    assert kv.block_table(0) == [0] and kv.num_tokens(0) == 2
    assert kv.num_free_blocks == 3 and kv.num_unreserved_blocks == 0
    kv.free(0)
    assert kv.num_free_blocks == 4 and kv.num_unreserved_blocks == 4 and not kv.holds(0)
    assert_blocks_add_up(kv)


def test_append_past_the_reservation_names_the_request():
    kv = store()
    kv.allocate(3, 4)
    with pytest.raises(RuntimeError, match="request 3 needs 3 more blocks but has 2 reserved"):
        kv.append(3, 5)
    kv.append(3, 4)  # negative control: the reservation itself is honoured


def test_allocate_refuses_a_second_reservation_and_an_oversized_one():
    kv = store(num_blocks=2)
    kv.allocate(0, 2)
    with pytest.raises(ValueError, match="request 0 already holds"):
        kv.allocate(0, 2)
    with pytest.raises(RuntimeError, match="cannot reserve 3 tokens for request 1"):
        kv.allocate(1, 3)
    kv.allocate(1, 2)


def test_canonical_marks_are_bounded_by_written_positions_and_cut_by_truncate():
    kv = store()
    kv.allocate(0, 8)
    kv.append(0, 5)
    with pytest.raises(ValueError, match="cannot mark 6 canonical positions of request 0: only 5"):
        kv.mark_canonical(0, 6)
    kv.mark_canonical(0, 5)
    assert [kv.is_block_canonical(0, i) for i in range(3)] == [True, True, False]
    kv.truncate(0, 3)
    assert kv.num_canonical(0) == 3
    assert [kv.is_block_canonical(0, i) for i in range(2)] == [True, False]


@pytest.mark.parametrize("field", ["num_blocks", "block_size", "num_scratch_slots"])
def test_a_bad_size_names_its_field(field):
    sizes = {"num_blocks": 4, "block_size": 2, "num_scratch_slots": 2, field: 0}
    with pytest.raises(ValueError, match=field):
        KVStore(CFG, **sizes)


# -- sharing and reference counts ---------------------------------------------------------------------
def test_a_shared_block_is_counted_once_and_cached_only_when_its_last_holder_leaves():
    kv = store(num_blocks=4)
    tokens = [5, 6, 7, 8]
    table = held(kv, 0, tokens)
    prefix = kv.match_prefix(tokens + [9])
    assert prefix == table
    kv.allocate(1, 5, prefix)
    kv.append(1, 5)
    assert kv.block_table(1)[:2] == table and kv.num_tokens(1) == 5 and kv.num_canonical(1) == 4
    assert kv.num_used_blocks == 3  # two shared, one of request 1's own
    kv.free(0)
    assert kv.num_used_blocks == 3 and kv.num_cached_blocks == 0  # still held by request 1
    kv.free(1)
    assert kv.num_cached_blocks == 2 and kv.num_free_blocks == 2
    assert_blocks_add_up(kv)


def test_reviving_a_cached_block_counts_against_the_unreserved_pool():
    kv = store(num_blocks=2)
    tokens = [5, 6]
    held(kv, 0, tokens)
    kv.free(0)  # block 0 cached, block 1 free
    prefix = kv.match_prefix(tokens + [7])
    assert prefix == [0] and kv.num_unreserved_blocks == 2
    kv.allocate(2, 2)  # reserves one block: the free one or, once taken, the cached one
    assert kv.num_unreserved_blocks == 1
    assert not kv.can_allocate(4, prefix)  # sharing block 0 takes it out of the pool, leaving no fresh block
    assert kv.can_allocate(2, prefix)
    kv.allocate(1, 2, prefix)
    assert kv.num_cached_blocks == 0 and kv.num_unreserved_blocks == 0
    kv.append(2, 2)
    assert kv.block_table(2) == [1]


def test_truncate_refuses_to_cut_into_published_blocks():
    kv = store()
    held(kv, 0, [5, 6, 7, 8], max_tokens=6)
    with pytest.raises(ValueError, match="request 0 into its shared prefix"):
        kv.truncate(0, 3)
    kv.truncate(0, 4)


# -- the prefix index ----------------------------------------------------------------------------------
def test_eviction_takes_the_least_recently_released_block_first():
    kv = store(num_blocks=3, block_size=2)
    for rid, tokens in enumerate(([1, 1], [2, 2], [3, 3])):
        held(kv, rid, tokens)
    for rid in (1, 0, 2):  # released in this order
        kv.free(rid)
    assert kv.num_cached_blocks == 3
    kv.allocate(9, 4)
    kv.append(9, 2)  # one fresh block: the cached block of request 1 goes
    assert kv.match_prefix([2, 2]) == [] and kv.match_prefix([1, 1]) != [] and kv.match_prefix([3, 3]) != []
    kv.truncate(9, 0)  # hand it back (unindexed, so free) and take two: the free one, then request 0's
    kv.append(9, 4)
    assert kv.match_prefix([1, 1]) == [] and kv.match_prefix([3, 3]) != []


def test_publish_skips_indexed_content_and_stops_below_an_unindexed_parent():
    index = PrefixIndex(block_size=2)
    tokens = [1, 2, 3, 4, 5, 6]
    assert index.publish([0, 1], tokens, num_published=0, num_full=2) == 2
    # the same first block's content under another block: skipped, and its child cannot be named
    assert index.publish([7, 8, 9], tokens, num_published=0, num_full=3) == 1
    assert index.match(tokens) == [0, 1]
    assert index.publish([0, 1, 2], tokens, num_published=2, num_full=3) == 3
    assert index.match(tokens) == [0, 1, 2]
    assert index.publish([0, 1, 2], tokens, num_published=3, num_full=1) == 3  # nothing new


def test_evicting_a_parent_frees_its_cached_descendants():
    index = PrefixIndex(block_size=1)
    index.publish([4, 5, 6], [1, 2, 3], num_published=0, num_full=3)
    for block in (6, 4, 5):
        assert index.release(block)
    assert not index.release(9)  # an unindexed block is not kept
    index.hold(5)  # a request takes block 5 again
    assert index.evict() == (6, [])
    assert index.evict() == (4, [])  # 5 leaves the index with its parent but is held, so not freed
    assert index.match([1, 2]) == [] and index.num_cached == 0


def test_evict_hands_back_descendants_nobody_holds():
    index = PrefixIndex(block_size=1)
    index.publish([4, 5, 6], [1, 2, 3], num_published=0, num_full=3)
    for block in (4, 5, 6):  # the root is released first, so it is evicted first
        index.release(block)
    assert index.evict() == (4, [6, 5])  # deepest first
    assert index.num_cached == 0


def test_drop_prefix_cache_frees_cached_blocks_and_keeps_held_ones():
    kv = store(num_blocks=4)
    held(kv, 0, [1, 1, 2, 2])
    held(kv, 1, [3, 3])
    kv.free(0)
    kv.drop_prefix_cache()
    assert kv.num_cached_blocks == 0 and kv.num_free_blocks == 3 and kv.holds(1)
    assert kv.match_prefix([1, 1, 2, 2]) == [] and kv.match_prefix([3, 3]) == []
    kv.free(1)
    assert kv.num_free_blocks == 4  # no longer indexed: freed, not cached


def test_a_disabled_prefix_cache_never_matches():
    kv = store(enable_prefix_cache=False)
    held(kv, 0, [1, 1])
    assert kv.match_prefix([1, 1, 2]) == []
    kv.free(0)
    assert kv.num_cached_blocks == 0


# -- tensors ------------------------------------------------------------------------------------------
def test_scratch_slots_lie_past_the_real_blocks_in_whole_blocks():
    tensors = KVTensors(CFG, num_blocks=3, block_size=4, num_scratch_slots=5, dtype=torch.float32, device="cpu")
    assert tensors.scratch_block == 3 and tensors.num_scratch_slots == 8
    assert [tensors.scratch_slot(i) for i in (0, 7, 8)] == [12, 19, 12]
    layers = tensors.layers()
    assert len(layers.k) == CFG.num_layers and layers.block_size == 4
    assert layers.k[0].shape == (5 * 4, CFG.num_kv_heads, CFG.head_dim)


# -- the protocol is all the engine needs -------------------------------------------------------------
PROTOCOL_MEMBERS = frozenset(KVStoreProtocol.__annotations__) | {
    name for name in vars(KVStoreProtocol) if not name.startswith("_")}


class ProtocolOnly:
    """A store that answers nothing but ``KVStoreProtocol``'s members (minus ``missing``)."""

    def __init__(self, inner, missing=()):
        self._inner, self._missing = inner, frozenset(missing)

    def __getattr__(self, name):
        if name not in PROTOCOL_MEMBERS or name in self._missing:
            raise AttributeError(name)
        return getattr(self._inner, name)


def test_an_injected_store_with_only_the_protocol_runs_the_engine_bit_exact():
    weights = random_weights(CFG, seed=4, lm_head_std=0.05)
    params = SamplingParams(max_new_tokens=10, deterministic=True, logprobs=True)
    prompts = [[3 + i, 7, 9, 11, 13, 5 + i] for i in range(3)]

    def make(**kwargs):
        return DVRGenerator(weights, CFG, window=4, group=2, block_size=2,
                            fast_policy=NoisyFastPolicy(scale=1.0, seed=1), **kwargs)

    kv = KVStore(CFG, num_blocks=64, block_size=2, num_scratch_slots=512)
    gen = make(kv_store=ProtocolOnly(kv))
    refs = make(kv_cache_tokens=128, prefix_cache=False).generate(prompts, params)
    for _ in range(2):  # the second round shares the first one's canonical prefix blocks
        outs = gen.generate(prompts, params)
        assert [o.token_ids for o in outs] == [r.token_ids for r in refs]
        assert [o.logprobs for o in outs] == [r.logprobs for r in refs]
    assert gen.stats["prefix_cached_tokens"] > 0
    assert kv.num_used_blocks == 0 and kv.num_cached_blocks > 0


def test_a_store_missing_a_protocol_member_is_refused_by_name():
    weights = random_weights(CFG, seed=4)
    kv = KVStore(CFG, num_blocks=8, block_size=2, num_scratch_slots=8)
    with pytest.raises(TypeError, match="kv_store"):
        DVRGenerator(weights, CFG, window=4, group=2, block_size=2, kv_store=ProtocolOnly(kv, missing={"truncate"}))
