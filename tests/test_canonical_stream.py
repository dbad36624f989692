"""``canonical_stream``: a CUDA engine option, validated everywhere, without effect on the CPU.

On CUDA each canonical pass then runs on its own stream, its graphs captured there
(tests/gpu/test_canonical_stream_cuda.py); on the CPU there is no stream to run on
(``canonical_thread`` is the CPU's counterpart), so committed output and the pass are unchanged.
"""

from __future__ import annotations

import pytest

from llm42 import DVRGenerator, SamplingParams
from llm42.model.weights import random_weights
from tests.helpers import tiny_config

CFG = tiny_config(max_position_embeddings=128)
WEIGHTS = random_weights(CFG, seed=4)
PARAMS = [SamplingParams(max_new_tokens=8, deterministic=True, ignore_eos=True, logprobs=True),
          SamplingParams(max_new_tokens=8, deterministic=True, ignore_eos=True, temperature=0.9, seed=3)]


def _generator(**kwargs) -> DVRGenerator:
    return DVRGenerator(WEIGHTS, CFG, window=4, group=2, kv_cache_tokens=512, **kwargs)


def test_canonical_stream_must_be_a_bool_and_excludes_an_injected_verifier():
    with pytest.raises(TypeError, match="canonical_stream must be a bool"):
        _generator(canonical_stream=1)
    verifier = _generator().verifier
    with pytest.raises(ValueError, match="canonical_stream or verifier"):
        _generator(canonical_stream=True, verifier=verifier)


def test_canonical_stream_changes_nothing_on_the_cpu():
    gen = _generator(canonical_stream=True)
    assert gen.config.canonical_stream and gen.verifier.canonical_pass._stream is None
    prompts = [[5, 9, 2, 7] * 5, [11, 3, 8]]
    outs = [(c.token_ids, c.logprobs) for c in gen.generate(prompts, PARAMS)]
    assert outs == [(c.token_ids, c.logprobs) for c in _generator().generate(prompts, PARAMS)]


def test_the_side_stream_and_wide_verify_defaults_resolve_off_on_the_cpu_and_accept_an_injected_verifier():
    gen = _generator()  # None: on CUDA both on (round 9), on the CPU both off
    assert gen.config.canonical_stream is None and gen.config.wide_verify is None
    assert gen.verifier.canonical_pass._stream is None and gen._max_canonical_results is None
    with pytest.raises(TypeError, match="wide_verify must be a bool"):
        _generator(wide_verify="yes")
    injected = _generator(verifier=gen.verifier)  # the default never clashes with an injected verifier
    assert injected.verifier is gen.verifier


def test_prioritize_fast_must_be_a_bool_and_changes_nothing_on_the_cpu():
    with pytest.raises(TypeError, match="prioritize_fast must be a bool"):
        _generator(prioritize_fast=1)
    gen = _generator(prioritize_fast=True)
    assert gen.config.prioritize_fast and gen._step_stream is None  # no stream to prioritise on the CPU
    prompts = [[5, 9, 2, 7] * 5, [11, 3, 8]]
    outs = [(c.token_ids, c.logprobs) for c in gen.generate(prompts, PARAMS)]
    assert outs == [(c.token_ids, c.logprobs) for c in _generator().generate(prompts, PARAMS)]


def test_canonical_gemm_streams_must_be_a_positive_int_and_lend_no_stream_on_the_cpu():
    """``canonical_gemm_streams`` (a wide pass's R-row GEMM blocks side by side on CUDA) is validated by name; on
    the CPU the pass gets no streams and its GEMM blocks run in turn (the exact GEMM: the same bits anyway)."""
    for bad in (0, -2, True, 2.0):
        with pytest.raises((TypeError, ValueError), match="canonical_gemm_streams"):
            _generator(canonical_gemm_streams=bad)
    gen = _generator(canonical_gemm_streams=3, max_canonical_tokens=16)
    assert gen.config.canonical_gemm_streams == 3 and gen.verifier.canonical_pass._block_streams == []
    assert gen.verifier.canonical_pass.max_rows == 16
