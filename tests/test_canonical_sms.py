"""``DVRGenerator(canonical_sms=N)``: the canonical pass on a share of the SMs (CUDA green contexts).

On the CPU the knob is validated and has no effect: the committed output equals the engine's without it (its
CUDA behaviour, the SMs reached and the bits, is tests/gpu/test_canonical_sms_cuda.py). A bad value is refused naming
the field, before anything is loaded; a verifier injected beside it is refused (it runs its own passes); a torch
without green-context streams is told so where one is asked for.
"""

from __future__ import annotations

import pytest

from llm42 import DVRGenerator, SamplingParams
from llm42.cuda_graphs import _green_stream, green_contexts_supported
from llm42.model.weights import random_weights
from llm42.policies import FixedShapePolicy
from llm42.runner import ModelRunner
from llm42.verify import CanonicalConfig, Verifier
from llm42.verify.canonical_pass import CanonicalPass
from llm42.testing import strategies as ls
from tests.helpers import serve

CFG = ls.wide_model_config(vocab_size=256, max_position_embeddings=128)
WEIGHTS = random_weights(CFG, seed=9)
WINDOW, GROUP = 6, 2


@pytest.mark.parametrize("bad,error", [(0, ValueError), (-8, ValueError), (True, TypeError), ("32", TypeError),
                                       (16.0, TypeError)])
def test_a_bad_canonical_sms_is_refused_naming_it(bad, error):
    with pytest.raises(error, match="canonical_sms"):
        DVRGenerator(WEIGHTS, CFG, canonical_sms=bad)


def test_canonical_sms_beside_an_injected_verifier_is_refused():
    verifier = Verifier(ModelRunner(WEIGHTS, CFG), FixedShapePolicy(), CanonicalConfig(window=WINDOW, group=GROUP))
    with pytest.raises(ValueError, match="canonical_sms or verifier"):
        DVRGenerator(WEIGHTS, CFG, window=WINDOW, group=GROUP, verifier=verifier, canonical_sms=16)


def test_a_bad_num_sms_of_a_canonical_pass_is_refused_naming_it():
    with pytest.raises(ValueError, match="num_sms"):
        CanonicalPass(WEIGHTS, CFG, FixedShapePolicy(), WINDOW * GROUP, num_sms=0)


def test_on_the_cpu_canonical_sms_changes_no_committed_bit():
    prompts = [[3, 14, 15, 92, 65], [35, 89, 79], [32, 38, 46, 26, 43, 38, 32]]
    params = [SamplingParams(max_new_tokens=20, deterministic=True, logprobs=True),
              SamplingParams(max_new_tokens=16, temperature=0.8, seed=4, deterministic=True, logprobs=True),
              SamplingParams(max_new_tokens=12, temperature=0.7, seed=2)]
    plain = serve(DVRGenerator(WEIGHTS, CFG, window=WINDOW, group=GROUP), prompts, params)
    gen = DVRGenerator(WEIGHTS, CFG, window=WINDOW, group=GROUP, canonical_sms=16)
    assert gen.config.canonical_sms == 16 and gen.verifier.canonical_pass.num_sms == 16
    confined = serve(gen, prompts, params)
    assert gen.stats["canonical_passes"] > 0  # the passes ran
    for a, b in zip(plain[:2], confined[:2]):
        assert a.token_ids == b.token_ids and a.logprobs == b.logprobs


@pytest.mark.skipif(green_contexts_supported(), reason="this torch has green-context streams")
def test_without_green_context_streams_asking_for_one_says_what_is_missing():
    with pytest.raises(RuntimeError, match="green contexts"):
        _green_stream(0, 16)


def test_on_cuda_a_torch_without_green_context_streams_is_refused_naming_canonical_sms(monkeypatch):
    """``EngineConfig.resolve_canonical_stream`` checks the torch before any stream is asked for, so a generator with
    ``canonical_sms`` on such a torch fails with a ValueError naming the field (not a RuntimeError from the stream pool);
    where green contexts are there the check lets it through to the device's SM count (the control: on this machine
    without CUDA that query fails otherwise, never with this message)."""
    import torch

    from llm42 import cuda_graphs
    from llm42.engine.config import EngineConfig

    config = EngineConfig(canonical_sms=16)
    monkeypatch.setattr(cuda_graphs, "green_contexts_supported", lambda: False)
    with pytest.raises(ValueError, match="canonical_sms needs CUDA green contexts"):
        config.resolve_canonical_stream(torch.device("cuda"), has_verifier=False)
    monkeypatch.setattr(cuda_graphs, "green_contexts_supported", lambda: True)
    props = type("Props", (), {"multi_processor_count": 8})
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    with pytest.raises(ValueError, match=r"canonical_sms \(16\) exceeds the device's 8 SMs"):
        config.resolve_canonical_stream(torch.device("cuda"), has_verifier=False)
