"""A fast step whose prompt-chunk part fails keeps what its decode part computed: no token goes missing,
and the engine resumes to the output it gives without the failure."""

import pytest

from llm42 import DVRGenerator, SamplingParams
from llm42.model.weights import random_weights
from llm42.runner import ModelRunner
from tests.helpers import tiny_config

CFG = tiny_config()
WEIGHTS = random_weights(CFG, seed=5, lm_head_std=0.05)


def test_failed_prefill_part_of_a_fast_step_loses_no_decode_token(monkeypatch):
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    prompts = [[5, 9, 14, 3], [7, 7, 8, 9, 10]]
    reference = DVRGenerator(WEIGHTS, CFG, window=3, group=2).generate(prompts, [params] * 2)
    gen = DVRGenerator(WEIGHTS, CFG, window=3, group=2)
    first = gen.submit(prompts[0], params)
    for _ in range(3):  # the first request is decoding
        gen.step()
    second = gen.submit(prompts[1], params)
    original = ModelRunner.forward_sample
    calls = {"n": 0}

    def fail_once(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected prefill fault")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ModelRunner, "forward_sample", fail_once)
    streamed = {first: list(gen.committed_tokens(first)), second: []}
    failures = 0
    while gen.has_unfinished():
        try:
            for rid, tokens in gen.step().items():
                streamed[rid] += tokens
        except RuntimeError as exc:
            assert "injected prefill fault" in str(exc)
            failures += 1
    assert failures == 1
    for rid, want in zip((first, second), reference):
        got = gen.result(rid)
        assert got.token_ids == want.token_ids and streamed[rid] == got.token_ids
