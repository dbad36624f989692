"""Every bad input named in API.md raises a clear error naming the field, before any work starts,
and leaves the other requests untouched."""

import pytest
import torch

from llm42 import DVRGenerator, SamplingParams
from llm42.model.weights import random_weights
from tests.helpers import tiny_config

CFG = tiny_config()
WEIGHTS = random_weights(CFG, seed=0)


def make(**kwargs) -> DVRGenerator:
    return DVRGenerator(WEIGHTS, CFG, window=4, group=2, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "error", "field"),
    [
        ({"max_new_tokens": 0}, ValueError, "max_new_tokens"),
        ({"max_new_tokens": -3}, ValueError, "max_new_tokens"),
        ({"max_new_tokens": 2.5}, TypeError, "max_new_tokens"),
        ({"temperature": -0.1}, ValueError, "temperature"),
        ({"temperature": float("nan")}, ValueError, "temperature"),
        ({"top_p": 0.0}, ValueError, "top_p"),
        ({"top_p": 1.5}, ValueError, "top_p"),
        ({"top_k": -1}, ValueError, "top_k"),
        ({"seed": 1.5}, TypeError, "seed"),
        ({"seed": "7"}, TypeError, "seed"),
        ({"deterministic": "yes"}, TypeError, "deterministic"),
        ({"stop_token_ids": (-1,)}, ValueError, "stop_token_ids"),
    ],
)
def test_bad_sampling_params_name_the_field(kwargs, error, field):
    with pytest.raises(error, match=field):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(
    ("prompt", "params", "error", "match"),
    [
        ([], SamplingParams(), ValueError, "prompt is empty"),
        ([1, CFG.vocab_size], SamplingParams(), ValueError, "token id"),
        ([1, -1], SamplingParams(), ValueError, "token id"),
        ([1, 2.0], SamplingParams(), TypeError, "token ids must be ints"),
        ([1] * 100, SamplingParams(max_new_tokens=29), ValueError, "max_new_tokens"),
        ("a string", SamplingParams(), ValueError, "tokenizer"),
        ([1, 2], "not params", TypeError, "SamplingParams"),
    ],
)
def test_bad_request_is_rejected_and_others_keep_running(prompt, params, error, match):
    gen = make()
    good = gen.submit([5, 6, 7], SamplingParams(max_new_tokens=6, deterministic=True))
    gen.step()
    before = gen.committed_tokens(good)
    with pytest.raises(error, match=match):
        gen.submit(prompt, params)
    assert gen.committed_tokens(good) == before
    while gen.has_unfinished():
        gen.step()
    alone = make().generate([[5, 6, 7]], SamplingParams(max_new_tokens=6, deterministic=True))[0]
    assert gen.result(good).token_ids == alone.token_ids


def test_generate_validates_every_prompt_before_queueing_any():
    gen = make()
    with pytest.raises(ValueError, match="prompt is empty"):
        gen.generate([[1, 2, 3], []], SamplingParams(max_new_tokens=4))
    assert not gen.has_unfinished()


def test_generate_rejects_mismatched_params_list():
    with pytest.raises(ValueError, match="params has 1 entries for 2 prompts"):
        make().generate([[1], [2]], [SamplingParams()])


@pytest.mark.parametrize(("window", "group", "error"), [(0, 2, ValueError), (4, 0, ValueError),
                                                        (-1, 1, ValueError), (2.0, 1, TypeError)])
def test_bad_window_or_group_names_the_field(window, group, error):
    field = "window" if window != 4 else "group"
    with pytest.raises(error, match=field):
        DVRGenerator(WEIGHTS, CFG, window=window, group=group)


def test_from_pretrained_rejects_bad_window_before_loading(tmp_path):
    # the path does not exist either; the window error must come first and name the field
    with pytest.raises(ValueError, match="window"):
        DVRGenerator.from_pretrained(tmp_path / "nowhere", window=0)


def test_result_of_unknown_or_unfinished_request():
    gen = make()
    rid = gen.submit([1, 2, 3], SamplingParams(max_new_tokens=4))
    with pytest.raises(ValueError, match="has not finished"):
        gen.result(rid)
    with pytest.raises(KeyError):
        gen.result(12345)


def test_prompt_as_tensor_is_accepted():
    gen = make()
    out = gen.generate([torch.tensor([3, 4, 5])], SamplingParams(max_new_tokens=3))[0]
    assert len(out.token_ids) == 3 and out.finish_reason == "length"


@pytest.mark.parametrize(
    ("kwargs", "error", "field"),
    [
        ({"block_size": 0}, ValueError, "block_size"),
        ({"block_size": -4}, ValueError, "block_size"),
        ({"prefix_cache": "no"}, TypeError, "prefix_cache"),
        ({"max_num_seqs": True}, TypeError, "max_num_seqs"),
        ({"kv_cache_tokens": True}, TypeError, "kv_cache_tokens"),
        ({"seed": "x"}, TypeError, "seed"),
        ({"scheduler": object()}, TypeError, "scheduler"),
        ({"fast_policy": object()}, TypeError, "fast_policy"),
        ({"canonical_policy": "fixed"}, TypeError, "canonical_policy"),
        ({"kv_store": object()}, TypeError, "kv_store"),
        ({"tokenizer": object()}, TypeError, "tokenizer"),
        ({"tokenizer": lambda text: {"input_ids": [1]}}, TypeError, "tokenizer"),  # no decode
        ({"window": CFG.max_position_embeddings + 1, "group": 1}, ValueError, "window"),
        ({"window": 10**6, "group": 1}, ValueError, "window"),  # refused before R rows are allocated
    ],
)
def test_bad_engine_argument_names_the_field_at_construction(kwargs, error, field):
    kwargs = {"window": 4, "group": 2, **kwargs}
    with pytest.raises(error, match=field):
        DVRGenerator(WEIGHTS, CFG, **kwargs)


def test_window_equal_to_the_context_is_accepted():
    # negative control for the check above: the bound is the context, not something smaller
    DVRGenerator(WEIGHTS, CFG, window=CFG.max_position_embeddings, group=1, kv_cache_tokens=256)


def test_key_block_rejects_bools_and_non_positive():
    from llm42.policies import FixedShapePolicy

    with pytest.raises(TypeError, match="key_block"):
        FixedShapePolicy(key_block=True)
    with pytest.raises(ValueError, match="key_block"):
        FixedShapePolicy(key_block=0)


def test_kv_store_sizes_reject_bools():
    from llm42 import KVStore

    with pytest.raises(TypeError, match="block_size"):
        KVStore(CFG, num_blocks=8, block_size=True)
    with pytest.raises(TypeError, match="enable_prefix_cache"):
        KVStore(CFG, num_blocks=8, enable_prefix_cache="no")


@pytest.mark.parametrize(("stops", "error"), [((1.5,), TypeError), ((True,), TypeError), ("ab", TypeError),
                                               (5, TypeError), ((3, -1), ValueError)])
def test_stop_token_ids_of_a_wrong_type_are_a_type_error(stops, error):
    with pytest.raises(error, match="stop_token_ids"):
        SamplingParams(stop_token_ids=stops)


@pytest.mark.parametrize("params", [5, "greedy", 2.0])
def test_generate_names_params_of_a_wrong_type(params):
    gen = make()
    with pytest.raises(TypeError, match="params"):
        gen.generate([[1, 2]], params=params)
    with pytest.raises(TypeError, match="params"):
        list(gen.stream([[1, 2]], params=params))
    assert not gen.has_unfinished()


def test_empty_string_prompt_is_rejected_like_an_empty_list():
    # the embedded tokenizer adds BOS, so "" would otherwise become the one-token prompt [1]
    gen = DVRGenerator.from_pretrained(window=4, group=2)
    assert gen.tokenizer("")["input_ids"], "negative control: the tokenizer alone turns '' into tokens"
    with pytest.raises(ValueError, match="prompt is empty"):
        gen.submit("", SamplingParams(max_new_tokens=2))
    with pytest.raises(ValueError, match="prompt is empty"):
        gen.generate(["Once", ""], SamplingParams(max_new_tokens=2))
    assert not gen.has_unfinished()


@pytest.mark.parametrize("kwargs, field", [
    (dict(decode_kernel="tiled"), "decode_kernel"),
    (dict(canonical_key_block=48), "canonical_key_block"),
    (dict(canonical_key_block=True), "canonical_key_block"),
])
def test_fast_policy_options_name_the_field(kwargs, field):
    from llm42.policies import FastPolicy

    with pytest.raises(ValueError, match=field):
        FastPolicy(**kwargs)
    assert "decode_kernel='canonical'" in repr(FastPolicy(decode_kernel="canonical"))
    assert repr(FastPolicy()) == "FastPolicy()"
