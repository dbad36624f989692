"""``DVRGenerator(prioritize_canonical=True)``: the canonical pass's stream at the device's highest priority.

On the CPU the knob is validated and has no effect: the committed output equals the engine's without it (on CUDA
the pass's stream is made at priority -1 and the bits are compared in tests/gpu/test_canonical_stream_cuda.py). A bad
value is refused naming the field, before anything is loaded; so are the combinations that cannot hold (beside
``prioritize_fast``, ``canonical_sms`` or an injected verifier). ``CanonicalPass(priority=)`` is checked the same way.
"""

from __future__ import annotations

import pytest

from llm42 import DVRGenerator, SamplingParams
from llm42.model.weights import random_weights
from llm42.policies import FixedShapePolicy
from llm42.runner import ModelRunner
from llm42.verify import CanonicalConfig, Verifier
from llm42.verify.canonical_pass import CanonicalPass
from llm42.testing import strategies as ls
from tests.helpers import serve

CFG = ls.wide_model_config(vocab_size=256, max_position_embeddings=128)
WEIGHTS = random_weights(CFG, seed=11)
WINDOW, GROUP = 6, 2


@pytest.mark.parametrize("bad", [1, "yes", None])
def test_a_bad_prioritize_canonical_is_refused_naming_it(bad):
    with pytest.raises(TypeError, match="prioritize_canonical"):
        DVRGenerator(WEIGHTS, CFG, prioritize_canonical=bad)


@pytest.mark.parametrize("other,match", [({"prioritize_fast": True}, "opposite orders"),
                                         ({"canonical_sms": 16}, "green-context")])
def test_prioritize_canonical_beside_a_knob_it_contradicts_is_refused(other, match):
    with pytest.raises(ValueError, match=match):
        DVRGenerator(WEIGHTS, CFG, prioritize_canonical=True, **other)


def test_prioritize_canonical_beside_an_injected_verifier_is_refused():
    verifier = Verifier(ModelRunner(WEIGHTS, CFG), FixedShapePolicy(), CanonicalConfig(window=WINDOW, group=GROUP))
    with pytest.raises(ValueError, match="prioritize_canonical or verifier"):
        DVRGenerator(WEIGHTS, CFG, window=WINDOW, group=GROUP, verifier=verifier, prioritize_canonical=True)


@pytest.mark.parametrize("bad", [1, True, 0.0, "-1"])
def test_a_bad_priority_of_a_canonical_pass_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match="priority"):
        CanonicalPass(WEIGHTS, CFG, FixedShapePolicy(), WINDOW * GROUP, priority=bad)


def test_a_canonical_pass_priority_on_a_green_context_is_refused():
    with pytest.raises(ValueError, match="priority or num_sms"):
        CanonicalPass(WEIGHTS, CFG, FixedShapePolicy(), WINDOW * GROUP, priority=-1, num_sms=16)


def test_on_the_cpu_prioritize_canonical_changes_no_committed_bit():
    prompts = [[3, 14, 15, 92, 65], [35, 89, 79], [32, 38, 46, 26, 43, 38, 32]]
    params = [SamplingParams(max_new_tokens=20, deterministic=True, logprobs=True),
              SamplingParams(max_new_tokens=16, temperature=0.8, seed=4, deterministic=True, logprobs=True),
              SamplingParams(max_new_tokens=12, temperature=0.7, seed=2)]
    plain = serve(DVRGenerator(WEIGHTS, CFG, window=WINDOW, group=GROUP), prompts, params)
    gen = DVRGenerator(WEIGHTS, CFG, window=WINDOW, group=GROUP, prioritize_canonical=True)
    assert gen.config.prioritize_canonical
    raised = serve(gen, prompts, params)
    assert gen.stats["canonical_passes"] > 0  # the passes ran
    for a, b in zip(plain[:2], raised[:2]):
        assert len(a.token_ids) > 0 and a.token_ids == b.token_ids and a.logprobs == b.logprobs
