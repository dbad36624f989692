"""Top-k / top-p requests served among plain ones: ``stats["filtered_steps"]`` counts the fast steps whose sampler
ran the filter; a deterministic request with a filter commits the same tokens alone and in the batch; the filter is
what moves its draws.

tests/gpu/test_filter_kernel_cuda.py serves the same at the 8B shape on CUDA from graphs, where the threshold is
``kernels.sampling.filter_threshold`` (``llm42.sampler.FILTER_KERNEL``) in decode, mixed and canonical steps.
"""

from __future__ import annotations

import random

import pytest

from llm42 import DVRGenerator, SamplingParams
from llm42.model.weights import random_weights
from tests.helpers import tiny_config

CFG = tiny_config()
WEIGHTS = random_weights(CFG, seed=9)
DETERMINISTIC = (12, 13)  # the deterministic requests with a filter (``batch(filtered=True)``)


def batch(vocab_size: int, *, filtered: bool) -> list[tuple[list[int], SamplingParams]]:
    """Sixteen requests: free ones with top-p (3) and top-k (8) and deterministic ones with top-k (12) and top-p
    (13) when ``filtered``; without, the same requests with no filter; the rest plain and free."""
    rng = random.Random(3)
    prompts = [[rng.randrange(vocab_size) for _ in range(rng.randrange(2, 20))] for _ in range(16)]
    params = [SamplingParams(max_new_tokens=10, temperature=0.9, seed=i, ignore_eos=True, logprobs=True)
              for i in range(16)]
    top_p, top_k = (0.6, 4) if filtered else (1.0, 0)
    params[3] = SamplingParams(max_new_tokens=10, temperature=1.1, top_p=top_p, seed=3, ignore_eos=True, logprobs=True)
    params[8] = SamplingParams(max_new_tokens=10, temperature=0.8, top_k=top_k, seed=8, ignore_eos=True, logprobs=True)
    params[12] = SamplingParams(max_new_tokens=10, temperature=1.5, top_k=3 if filtered else 0, seed=12,
                                ignore_eos=True, logprobs=True, deterministic=True)
    params[13] = SamplingParams(max_new_tokens=10, temperature=1.5, top_p=0.5 if filtered else 1.0, seed=13,
                                ignore_eos=True, logprobs=True, deterministic=True)
    return list(zip(prompts, params))


def serve(requests, *, mixed_steps: bool, model=(CFG, WEIGHTS), **engine):
    """(results, stats) of ``requests`` [(prompt, params)] served to the end."""
    cfg, weights = model
    gen = DVRGenerator(weights, cfg, window=3, group=2, max_num_seqs=16, max_fast_tokens=64, kv_cache_tokens=4096,
                       mixed_steps=mixed_steps, **engine)
    rids = [gen.submit(p, q) for p, q in requests]
    while gen.has_unfinished():
        gen.step()
    return [gen.result(r) for r in rids], dict(gen.stats)


def check_filtered_steps(mixed_steps: bool, model=(CFG, WEIGHTS), **engine) -> None:
    vocab_size = model[0].vocab_size
    served, stats = serve(batch(vocab_size, filtered=True), mixed_steps=mixed_steps, model=model, **engine)
    unfiltered, plain_stats = serve(batch(vocab_size, filtered=False), mixed_steps=mixed_steps, model=model, **engine)
    assert plain_stats["filtered_steps"] == 0
    assert 0 < stats["filtered_steps"] <= stats["fast_steps"]
    if mixed_steps:
        assert stats["mixed_steps"] >= 1
    for i in DETERMINISTIC:  # alone, a deterministic request commits what it commits in the batch
        (alone,), _ = serve([batch(vocab_size, filtered=True)[i]], mixed_steps=mixed_steps, model=model, **engine)
        assert alone.token_ids == served[i].token_ids and alone.logprobs == served[i].logprobs, i
    # control: without their filters they commit other tokens (the filter is applied, the comparison not vacuous)
    assert all(served[i].token_ids != unfiltered[i].token_ids for i in DETERMINISTIC)


@pytest.mark.parametrize("mixed_steps", [False, True])
def test_filtered_steps_are_counted_and_deterministic_filtered_requests_keep_their_bits(mixed_steps):
    check_filtered_steps(mixed_steps)
