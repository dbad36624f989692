"""The decode state tells the fast path which of a decode step's rows are deterministic requests'
(``StepInputs.deterministic_rows``), so ``FastPolicy(decode_kernel="deterministic")`` can give those rows the
canonical attention's bits (the kernels' own checks: tests/test_tiled_attention.py, tests/gpu)."""

from __future__ import annotations

import pytest
import torch

from llm42 import DVRGenerator, KVStore, SamplingParams
from llm42.engine.decode_state import DecodeState
from llm42.inputs import StepInputs
from llm42.model.weights import random_weights
from llm42.policies import FastPolicy
from tests.helpers import tiny_config

CFG = tiny_config()
WEIGHTS = random_weights(CFG, seed=5)


def _state(policy=None):
    kv = KVStore(CFG, num_blocks=32, block_size=8, num_scratch_slots=32)
    policy = FastPolicy(decode_kernel="deterministic") if policy is None else policy
    state = DecodeState(WEIGHTS, CFG, kv, policy, max_num_seqs=4)
    for rid in range(4):
        kv.allocate(rid, 12)
        kv.append(rid, 4)
    return kv, state


def test_decode_rows_carry_the_deterministic_flag_of_their_slot():
    kv, state = _state()
    kinds = [True, False, True, False]
    for slot, is_det in enumerate(kinds):
        state.admit(slot, slot, SamplingParams(deterministic=is_det), 7)
    state.flush()
    state.stage_batch([3, 0, 2], 4)  # a padding row last
    _, _, inputs = state.decode_inputs(4, None)
    assert inputs.deterministic_rows.tolist() == [0, 1, 1, 0]
    # a slot taken over by a request of the other kind carries the new request's flag
    state.release(0)
    kv.free(0)
    kv.allocate(9, 12)
    state.admit(0, 9, SamplingParams(), 1)
    state.flush()
    state.stage_batch([0, 2], 2)
    _, _, inputs = state.decode_inputs(2, None)
    assert inputs.deterministic_rows.tolist() == [0, 1]


def test_a_policy_that_does_not_read_the_flags_gets_none():
    _, state = _state(FastPolicy())
    state.admit(0, 0, SamplingParams(deterministic=True), 7)
    state.flush()
    state.stage_batch([0], 1)
    assert state.decode_inputs(1, None)[2].deterministic_rows is None


def test_joined_step_keeps_the_decode_part_flags():
    _, state = _state()
    state.admit(0, 0, SamplingParams(deterministic=True), 7)
    state.admit(1, 1, SamplingParams(), 7)
    state.flush()
    state.stage_batch([0, 1], 2)
    _, _, decode = state.decode_inputs(2, None)
    joined = StepInputs.join([decode, decode])
    assert all(part.deterministic_rows.tolist() == [1, 0] for _, part in joined.parts)


def test_the_default_fast_path_keeps_the_split_kernel():
    """The option is opt-in (it measured slower on the H200 than it saves: docs/benchmarks.md, round 11)."""
    gen = DVRGenerator(WEIGHTS, CFG, kv_cache_tokens=256)
    assert gen.fast_policy.decode_kernel == "split"
    from llm42.policies import FixedShapePolicy

    mine = FastPolicy(decode_kernel="deterministic", canonical_key_block=16)
    gen = DVRGenerator(WEIGHTS, CFG, fast_policy=mine, canonical_policy=FixedShapePolicy(key_block=16),
                       kv_cache_tokens=256)
    assert gen.fast_policy is mine


def test_decode_kernel_is_checked():
    with pytest.raises(ValueError, match="decode_kernel"):
        FastPolicy(decode_kernel="deterministc")


def test_key_chunk_options_are_checked():
    from llm42.policies import BatchInvariantPolicy, FixedShapePolicy

    policy = FixedShapePolicy(attention_kernel="chunked", key_chunk=256)
    assert policy.key_chunk == 256 and "key_chunk=256" in repr(policy)
    assert "key_chunk" not in repr(FixedShapePolicy())
    with pytest.raises(ValueError, match="key_chunk .* multiple of key_block"):
        FixedShapePolicy(key_block=64, attention_kernel="chunked", key_chunk=96)
    with pytest.raises(TypeError, match="key_chunk"):
        FixedShapePolicy(attention_kernel="chunked", key_chunk=True)
    with pytest.raises(ValueError, match="FastPolicy key_chunk"):
        FastPolicy(decode_kernel="deterministic", canonical_key_block=64, canonical_key_chunk=100)
    fast = FastPolicy(decode_kernel="deterministic", canonical_key_chunk=512)
    assert "canonical_key_chunk=512" in repr(fast)
    assert "key_chunk=128" in repr(BatchInvariantPolicy(attention_kernel="chunked", key_chunk=128))


def test_a_fast_path_on_another_canonical_attention_is_warned_about():
    """FastPolicy(decode_kernel=...) naming another canonical attention than the canonical policy runs (key block,
    tile height, chunking) gets a warning naming the fields; a matching pair and the split kernel get none."""
    import warnings

    from llm42.policies import FixedShapePolicy
    from llm42.policies.fast import canonical_decode_mismatches

    cases = [
        (FastPolicy(decode_kernel="deterministic", canonical_tile_m=128), FixedShapePolicy(), "canonical_tile_m=128"),
        (FastPolicy(decode_kernel="canonical", canonical_key_block=32), FixedShapePolicy(), "canonical_key_block=32"),
        (FastPolicy(decode_kernel="deterministic"), FixedShapePolicy(attention_kernel="chunked", key_chunk=256),
         "key_chunk=256"),
        (FastPolicy(decode_kernel="deterministic"), FixedShapePolicy(attention_kernel="rows"), "'rows'"),
    ]
    for fast, canonical, field in cases:
        with pytest.warns(UserWarning, match=field):
            DVRGenerator(WEIGHTS, CFG, fast_policy=fast, canonical_policy=canonical, kv_cache_tokens=256).close()
    matched = [
        (FastPolicy(decode_kernel="deterministic", canonical_tile_m=128), FixedShapePolicy(tile_m=128)),
        (FastPolicy(decode_kernel="deterministic", canonical_key_chunk=256),
         FixedShapePolicy(attention_kernel="chunked", key_chunk=256)),
        (FastPolicy(canonical_tile_m=128), FixedShapePolicy()),  # the split kernel: the field is not used
        (FastPolicy(decode_kernel="deterministic"), FixedShapePolicy(attention_kernel="tiled_masked")),
    ]
    for fast, canonical in matched:
        assert canonical_decode_mismatches(fast, canonical) == []
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            DVRGenerator(WEIGHTS, CFG, fast_policy=fast, canonical_policy=canonical, kv_cache_tokens=256).close()
