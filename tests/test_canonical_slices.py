"""``canonical_slices``: a canonical pass's layers in slices, one a step, commit the whole pass's bits.

At the pass: a sliced pass staged on the same K/V gives the unsliced pass's tokens and log-probs bit for bit, is
not ready until its last slice has run (one per ``advance``; ``wait`` runs the rest), and the K/V it writes is the
same. Negative control: slices whose bounds skip a layer give other bits, so the comparison can fail. In the
engine: deterministic outputs equal their alone-runs with passes sliced 2 and 4 ways and a forced-divergence fast
path, and passes really are in flight across steps (counted). Bad values name the field.
"""

from __future__ import annotations

import random

import pytest
import torch

from llm42 import DVRGenerator
from llm42.model.weights import random_weights
from llm42.policies import NoisyFastPolicy
from llm42.verify import canonical_pass as canonical_pass_module
from llm42.verify.pass_shapes import slice_bounds
from tests.helpers import launch_prompt_pass, pass_bits, tiny_config
from tests.test_canonical_thread import _requests
from tests.test_split_pass_steps import assert_alone_bits

CFG = tiny_config(max_position_embeddings=256, num_layers=4)
WEIGHTS = random_weights(CFG, seed=5, lm_head_std=0.05)


def test_slice_bounds_cover_every_layer_once_as_evenly_as_whole_layers_allow():
    assert slice_bounds(4, 1) == (0, 4) and slice_bounds(4, 4) == (0, 1, 2, 3, 4)
    assert slice_bounds(30, 4) == (0, 8, 16, 23, 30)
    for layers in range(1, 12):
        for n in range(1, layers + 1):
            b = slice_bounds(layers, n)
            sizes = [b[i + 1] - b[i] for i in range(n)]
            assert b[0] == 0 and b[-1] == layers and max(sizes) - min(sizes) <= 1 and min(sizes) >= 1


def _generator(**kwargs) -> DVRGenerator:
    return DVRGenerator(WEIGHTS, CFG, window=4, group=2, kv_cache_tokens=4096, max_fast_tokens=64, **kwargs)


def _pass_results(num_slices: int, *, bounds=None, monkeypatch=None):
    """One pass over two prompts' rows on fresh K/V: (tokens, log-prob bits, every layer's K/V at the pass's rows,
    how many advances it took to be ready)."""
    gen = _generator(canonical_slices=num_slices)
    if bounds is not None:
        monkeypatch.setattr(gen.verifier.canonical_pass, "_bounds", bounds)
    rng = random.Random(0)
    prompts = [[1] + [rng.randrange(3, CFG.vocab_size) for _ in range(n)] for n in (9, 14)]
    result, slots = launch_prompt_pass(gen, prompts)
    advances = 0
    while not result.is_ready():
        result.advance()
        advances += 1
        assert advances <= num_slices
    tokens, logprobs, written = pass_bits(result, gen.kv, list(range(CFG.num_layers)), slots)
    return tokens, logprobs, written, advances


def test_a_sliced_pass_gives_the_whole_pass_bits_and_is_ready_after_its_last_slice():
    whole = _pass_results(1)
    assert whole[3] == 0
    for n in (2, 4):
        tokens, logprobs, written, advances = _pass_results(n)
        assert advances == n - 1  # the first slice at launch, one more per advance
        assert (tokens, logprobs) == (whole[0], whole[1])
        assert all(torch.equal(a, b) for a, b in zip(written, whole[2]))


def test_negative_control_slices_that_skip_a_layer_give_other_bits(monkeypatch):
    whole = _pass_results(1)
    tokens, logprobs, _, _ = _pass_results(2, bounds=(0, 1, 4), monkeypatch=monkeypatch)
    assert (tokens, logprobs) == (whole[0], whole[1])  # other cuts, every layer once: the same bits
    tokens, logprobs, _, _ = _pass_results(2, bounds=(0, 1, 3), monkeypatch=monkeypatch)  # the last layer skipped
    assert (tokens, logprobs) != (whole[0], whole[1])


def test_wait_runs_the_slices_left():
    gen = _generator(canonical_slices=4)
    result, _ = launch_prompt_pass(gen, [[1, 5, 6, 7]])
    assert result.has_pending_slices and not result.is_ready()
    tokens, _ = result.wait()
    assert not result.has_pending_slices and result.is_ready() and len(tokens) >= 4


@pytest.mark.parametrize("num_slices", [2, 4])
def test_sliced_passes_commit_the_alone_bits_and_span_steps(num_slices):
    prompts, params = _requests(num_slices, 12)
    gen = _generator(canonical_slices=num_slices, fast_policy=NoisyFastPolicy(scale=2.0, seed=3))
    rids = [gen.submit(p, s) for p, s in zip(prompts, params)]
    pending_at_step_end = 0
    while gen.has_unfinished():
        gen.step()
        in_flight = gen.passes.oldest
        pending_at_step_end += in_flight is not None and in_flight.result.has_pending_slices
    got = [gen.result(rid) for rid in rids]
    assert pending_at_step_end > 0, "no pass was ever in flight with slices left: the test would prove nothing"
    assert gen.stats["rollbacks"] > 0
    assert_alone_bits(prompts, params, got, alone=_generator())


@pytest.mark.parametrize("kwargs, field", [
    ({"canonical_slices": 0}, "canonical_slices"),
    ({"canonical_slices": True}, "canonical_slices"),
    ({"canonical_slices": 5}, "canonical_slices"),
    ({"canonical_slices": 2, "canonical_thread": True}, "canonical_slices"),
])
def test_bad_canonical_slices_name_the_field(kwargs, field):
    with pytest.raises((ValueError, TypeError), match=field):
        _generator(**kwargs)


def test_the_module_exports_slice_bounds():
    assert canonical_pass_module.slice_bounds is slice_bounds
