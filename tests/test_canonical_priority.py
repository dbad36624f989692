"""``DVRGenerator(canonical_priority=...)``: the canonical pass's stream priority against the fast steps'.

On the CPU the knob is validated and has no effect: the committed output equals the engine's without it (on CUDA
the pass's streams are made at priority -1 and the bits are compared in tests/gpu/test_canonical_stream_cuda.py). A bad
value is refused naming the field, before anything is loaded; so are the combinations that cannot hold (beside
``prioritize_fast``, ``canonical_sms`` or an injected verifier). ``CanonicalPass(priority=, prompt_priority=)`` is
checked the same way, and a pass launched ``urgent`` by the verifier is exactly one that carries a prompt chunk.
"""

from __future__ import annotations

import pytest

from llm42 import DVRGenerator, SamplingParams
from llm42.engine.config import CANONICAL_PRIORITIES, EngineConfig
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


@pytest.mark.parametrize("bad", [True, "highest", None, -1])
def test_a_bad_canonical_priority_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match="canonical_priority"):
        DVRGenerator(WEIGHTS, CFG, canonical_priority=bad)


@pytest.mark.parametrize("priority", ["prompts", "high"])
@pytest.mark.parametrize("other,match", [({"prioritize_fast": True}, "opposite orders"),
                                         ({"canonical_sms": 16}, "green-context")])
def test_canonical_priority_beside_a_knob_it_contradicts_is_refused(priority, other, match):
    with pytest.raises(ValueError, match=match):
        DVRGenerator(WEIGHTS, CFG, canonical_priority=priority, **other)


def test_canonical_priority_beside_an_injected_verifier_is_refused():
    verifier = Verifier(ModelRunner(WEIGHTS, CFG), FixedShapePolicy(), CanonicalConfig(window=WINDOW, group=GROUP))
    with pytest.raises(ValueError, match="canonical_priority or verifier"):
        DVRGenerator(WEIGHTS, CFG, window=WINDOW, group=GROUP, verifier=verifier, canonical_priority="high")


def test_each_canonical_priority_names_its_streams_priorities():
    got = {p: EngineConfig(canonical_priority=p).canonical_stream_priorities() for p in CANONICAL_PRIORITIES}
    assert got == {"low": (0, None), "prompts": (0, -1), "high": (-1, None)}


@pytest.mark.parametrize("name", ["priority", "prompt_priority"])
@pytest.mark.parametrize("bad", [1, True, 0.0, "-1"])
def test_a_bad_priority_of_a_canonical_pass_is_refused_naming_it(name, bad):
    with pytest.raises(ValueError, match=name):
        CanonicalPass(WEIGHTS, CFG, FixedShapePolicy(), WINDOW * GROUP, **{name: bad})


def test_a_canonical_pass_priority_on_a_green_context_is_refused():
    with pytest.raises(ValueError, match="priority or num_sms"):
        CanonicalPass(WEIGHTS, CFG, FixedShapePolicy(), WINDOW * GROUP, prompt_priority=-1, num_sms=16)


PROMPTS = [[3, 14, 15, 92, 65], [35, 89, 79], [32, 38, 46, 26, 43, 38, 32]]
PARAMS = [SamplingParams(max_new_tokens=20, deterministic=True, logprobs=True),
          SamplingParams(max_new_tokens=16, temperature=0.8, seed=4, deterministic=True, logprobs=True),
          SamplingParams(max_new_tokens=12, temperature=0.7, seed=2)]


@pytest.mark.parametrize("priority", ["prompts", "high"])
def test_on_the_cpu_canonical_priority_changes_no_committed_bit(priority):
    plain = serve(DVRGenerator(WEIGHTS, CFG, window=WINDOW, group=GROUP), PROMPTS, PARAMS)
    gen = DVRGenerator(WEIGHTS, CFG, window=WINDOW, group=GROUP, canonical_priority=priority)
    assert gen.config.canonical_priority == priority
    raised = serve(gen, PROMPTS, PARAMS)
    assert gen.stats["canonical_passes"] > 0  # the passes ran
    for a, b in zip(plain[:2], raised[:2]):
        assert len(a.token_ids) > 0 and a.token_ids == b.token_ids and a.logprobs == b.logprobs


def test_the_verifier_launches_exactly_the_passes_with_prompt_chunks_urgent(monkeypatch):
    gen = DVRGenerator(WEIGHTS, CFG, window=WINDOW, group=GROUP)
    prompt_len: dict[int, int] = {}
    seen = []
    launch = CanonicalPass.launch

    def spy(self, segments, kv, per_row, **kwargs):
        # a prompt chunk's rows sit before the prompt's end; a window starts at a committed output token
        seen.append((kwargs.get("urgent"), any(seg.start < prompt_len[seg.rid] for seg in segments)))
        return launch(self, segments, kv, per_row, **kwargs)

    monkeypatch.setattr(CanonicalPass, "launch", spy)
    for prompt, params in zip(PROMPTS, PARAMS):
        prompt_len[gen.submit(prompt, params)] = len(prompt)
    while gen.has_unfinished():
        gen.step()
    assert {urgent for urgent, _ in seen} == {True, False}  # both kinds of pass ran: the check is not vacuous
    assert all(urgent == has_prompt for urgent, has_prompt in seen)
