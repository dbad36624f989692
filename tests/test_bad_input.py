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
