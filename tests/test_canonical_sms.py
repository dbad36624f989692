"""``DVRGenerator(canonical_sms=N)``: the canonical pass on a share of the SMs (CUDA green contexts).

On the CPU the knob is validated and has no effect: the committed output equals the engine's without it (its
CUDA behaviour, the SMs reached and the bits, is tests/gpu/test_canonical_sms_cuda.py). A bad value is refused naming
the field, before anything is loaded; a verifier injected beside it is refused (it runs its own passes); a torch
without green-context streams is told so where one is asked for. ``canonical_sms_max_rows`` (round 43): its errors,
which buckets it confines, how a pass's bucket picks its stream, and the ``confined_passes`` count.
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


# -- canonical_sms_max_rows: only passes of at most that many rows confined (round 43) ---------------------------------

@pytest.mark.parametrize("bad,error", [(0, ValueError), (-8, ValueError), (True, TypeError), ("32", TypeError),
                                       (16.0, TypeError)])
def test_a_bad_canonical_sms_max_rows_is_refused_naming_it(bad, error):
    with pytest.raises(error, match="canonical_sms_max_rows"):
        DVRGenerator(WEIGHTS, CFG, window=WINDOW, group=GROUP, canonical_sms=16, canonical_sms_max_rows=bad)


def test_canonical_sms_max_rows_needs_canonical_sms_and_at_least_r_rows():
    r = WINDOW * GROUP
    with pytest.raises(ValueError, match="canonical_sms_max_rows .*needs canonical_sms"):
        DVRGenerator(WEIGHTS, CFG, window=WINDOW, group=GROUP, canonical_sms_max_rows=4 * r)
    with pytest.raises(ValueError, match=rf"canonical_sms_max_rows \({r - 1}\) is under .* = {r} rows"):
        DVRGenerator(WEIGHTS, CFG, window=WINDOW, group=GROUP, canonical_sms=16, canonical_sms_max_rows=r - 1)
    verifier = Verifier(ModelRunner(WEIGHTS, CFG), FixedShapePolicy(), CanonicalConfig(window=WINDOW, group=GROUP))
    with pytest.raises(ValueError, match="canonical_sms or verifier"):  # the pass it bounds is the verifier's own
        DVRGenerator(WEIGHTS, CFG, window=WINDOW, group=GROUP, verifier=verifier, canonical_sms=16,
                     canonical_sms_max_rows=r)
    gen = DVRGenerator(WEIGHTS, CFG, window=WINDOW, group=GROUP, canonical_sms=16, canonical_sms_max_rows=r)  # control
    assert gen.config.canonical_sms_max_rows == r and gen.verifier.canonical_pass.sms_max_rows == r
    assert gen.verifier.canonical_pass.confined_buckets == ()  # the CPU has no green context: nothing is confined
    gen.close()


def test_a_canonical_pass_refuses_a_bad_sms_max_rows_naming_it():
    r = WINDOW * GROUP
    with pytest.raises(ValueError, match="sms_max_rows bounds the passes num_sms confines"):
        CanonicalPass(WEIGHTS, CFG, FixedShapePolicy(), r, max_rows=4 * r, sms_max_rows=2 * r)
    with pytest.raises(ValueError, match=rf"sms_max_rows \({r - 1}\) is under R = {r}"):
        CanonicalPass(WEIGHTS, CFG, FixedShapePolicy(), r, max_rows=4 * r, num_sms=16, sms_max_rows=r - 1)
    with pytest.raises(ValueError, match="sms_max_rows"):
        CanonicalPass(WEIGHTS, CFG, FixedShapePolicy(), r, max_rows=4 * r, num_sms=16, sms_max_rows=0)


@pytest.mark.parametrize("bound,confined", [(None, (256, 512, 1024, 2048)), (256, (256,)), (1024, (256, 512, 1024)),
                                            (700, (256, 512)), (4096, (256, 512, 1024, 2048))])
def test_the_confined_buckets_are_those_of_at_most_the_bound(bound, confined):
    """A pass's SMs follow from its bucket, which follows from its rows alone: the buckets up to the bound (a bound
    between two buckets confines the smaller); ``None`` every bucket."""
    from llm42.verify.pass_shapes import confined_buckets, pass_buckets

    buckets = pass_buckets(256, 2048)
    assert buckets == (256, 512, 1024, 2048)
    assert confined_buckets(buckets, bound) == confined


def test_each_bucket_runs_on_its_shares_stream():
    """``_stream_for`` routes a bucket to the green context's stream when confined, else to the wide stream (also a
    pass's GEMM-block streams); without a wide stream (no bound, or every bucket under it) every bucket goes to the
    pass's one stream. Streams stand in as sentinels: on the CPU a pass has none (its CUDA routing, SMs and bits are
    tests/gpu/test_canonical_sms_cuda.py's)."""
    r = WINDOW * GROUP
    cp = CanonicalPass(WEIGHTS, CFG, FixedShapePolicy(), r, max_rows=4 * r)
    green, wide, blocks_green, blocks_wide = object(), object(), [object()], [object()]
    cp._stream = cp._urgent_stream = green
    cp._block_streams, cp._wide_block_streams = blocks_green, blocks_wide
    cp.confined_buckets = tuple(b for b in cp.buckets if b <= r)
    assert len(cp.buckets) > 1
    cp._wide_stream = None  # control: no split, every bucket on the pass's stream
    assert all(cp._stream_for(b) is green and cp._block_streams_for(b) is blocks_green for b in cp.buckets)
    cp._wide_stream = wide
    for b in cp.buckets:
        expected = (green, blocks_green) if b <= r else (wide, blocks_wide)
        assert (cp._stream_for(b), cp._block_streams_for(b)) == expected, b
        assert cp._stream_for(b, urgent=True) is expected[0]


def test_on_the_cpu_canonical_sms_max_rows_changes_no_committed_bit():
    prompts = [[3, 14, 15, 92, 65] * 6, [35, 89, 79], [32, 38, 46, 26, 43, 38, 32]]
    params = [SamplingParams(max_new_tokens=20, deterministic=True, logprobs=True),
              SamplingParams(max_new_tokens=16, temperature=0.8, seed=4, deterministic=True, logprobs=True),
              SamplingParams(max_new_tokens=12, temperature=0.7, seed=2)]
    plain = serve(DVRGenerator(WEIGHTS, CFG, window=WINDOW, group=GROUP), prompts, params)
    gen = DVRGenerator(WEIGHTS, CFG, window=WINDOW, group=GROUP, canonical_sms=16,
                       canonical_sms_max_rows=WINDOW * GROUP)
    split = serve(gen, prompts, params)
    assert gen.stats["canonical_passes"] > 0
    for a, b in zip(plain[:2], split[:2]):
        assert a.token_ids == b.token_ids and a.logprobs == b.logprobs


def test_confined_passes_counts_the_passes_of_the_confined_buckets():
    """``stats["confined_passes"]``: the passes whose bucket the green context confines (none on the CPU, the control);
    with the R-row bucket marked confined (as ``canonical_sms_max_rows=R`` makes it on CUDA) the R-row passes count and
    the wider ones (a long prompt's chunks) do not."""
    r = WINDOW * GROUP
    prompts = [[7 + i % 200 for i in range(5 * r)], [35, 89, 79], [32, 38, 46, 26, 43, 38, 32]]
    params = [SamplingParams(max_new_tokens=12, deterministic=True),
              SamplingParams(max_new_tokens=16, temperature=0.8, seed=4, deterministic=True),
              SamplingParams(max_new_tokens=12, temperature=0.7, seed=2)]

    def build():
        return DVRGenerator(WEIGHTS, CFG, window=WINDOW, group=GROUP, max_canonical_tokens=4 * r, wide_verify=True,
                            max_fast_tokens=4 * r)

    plain = build()
    serve(plain, prompts, params)
    assert plain.stats["canonical_passes"] > 0 and plain.stats["confined_passes"] == 0  # the CPU confines nothing
    gen = build()
    gen.passes._confined_buckets = frozenset({r})
    sizes = []
    launch = gen.verifier.launch

    def recording(work, kv):
        launched = launch(work, kv)
        sizes.append(launched.result.num_rows)
        return launched

    gen.verifier.launch = recording
    serve(gen, prompts, params)
    assert r in sizes and any(size > r for size in sizes), sizes  # both kinds ran
    assert gen.stats["confined_passes"] == sizes.count(r)
