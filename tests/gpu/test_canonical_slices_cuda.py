"""A canonical pass in layer slices on CUDA (``canonical_slices``): each slice a captured graph of its own on the
pass's stream, one launched a step, commits the whole pass's bits.

The same requests through the default (one graph a pass) and through passes cut into 2 and 4 slices: deterministic
outputs and log-probs identical, and passes really were in flight across steps with slices left (counted, not
vacuous). At the pass: a sliced pass on the same staged K/V gives the whole pass's tokens and log-probs, is not ready
before its last slice, and writes the same K/V. Negative control: the same requests served free (the fast path's
own tokens) are not the committed bits.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

pytest.importorskip("triton")

import torch  # noqa: E402

from tests.gpu.test_engine_cuda import make_generator, random_prompt  # noqa: E402
from tests.gpu.test_pass_order_cuda import _case, serve  # noqa: E402
from tests.helpers import launch_prompt_pass, pass_bits  # noqa: E402

pytestmark = pytest.mark.gpu


def _slices_left(gen):
    """Per step, whether a pass is in flight with slices left."""
    def counted() -> bool:
        in_flight = gen.passes.oldest
        return in_flight is not None and in_flight.result.has_pending_slices

    return counted


def _run(llama8b, params=None, **kwargs):
    return serve(llama8b, params=params, watch=_slices_left, **kwargs)


def test_sliced_passes_commit_the_whole_pass_bits(llama8b, report):
    reference, stats, pending = _run(llama8b)
    assert pending == 0 and stats["rollbacks"] > 0
    got = {}
    for n in (2, 4):
        outputs, stats, pending = _run(llama8b, canonical_slices=n)
        got[n] = {"steps_with_slices_left": pending, "canonical_passes": stats["canonical_passes"],
                  "rollbacks": stats["rollbacks"]}
        assert pending > 0, f"{n} slices: no pass was in flight with slices left"
        assert outputs == reference, f"{n} slices"
    report("canonical_slices_cuda", got)
    cfg, _ = llama8b
    _, params = _case(cfg)
    free, _, _ = _run(llama8b, params=[dataclasses.replace(q, deterministic=False) for q in params])
    assert free != reference  # negative control


def _one_pass(llama8b, num_slices: int):
    """One pass over two prompts' rows on fresh K/V: (tokens, log-prob bits, the K/V of layer 0 and the last layer at
    the pass's rows, advances it took)."""
    cfg, _ = llama8b
    gen = make_generator(llama8b, max_canonical_tokens=512, canonical_slices=num_slices)
    rng = random.Random(3)
    result, slots = launch_prompt_pass(gen, [random_prompt(rng, cfg.vocab_size, n) for n in (40, 70)])
    advances = 0
    while result.has_pending_slices:
        assert not result.is_ready()
        result.advance()
        advances += 1
    tokens, bits, written = pass_bits(result, gen.kv, [0, cfg.num_layers - 1], slots)
    gen.close()
    return tokens, bits, written, advances


def test_a_sliced_pass_is_the_whole_pass_bit_for_bit(llama8b):
    whole = _one_pass(llama8b, 1)
    assert whole[3] == 0
    sliced = _one_pass(llama8b, 4)
    assert sliced[3] == 3
    assert sliced[:2] == whole[:2]
    assert all(torch.equal(a, b) for a, b in zip(sliced[2], whole[2]))
