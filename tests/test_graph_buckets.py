"""The fast path's graph row ladder (``llm42.cuda_graphs.row_buckets``, ``DVRGenerator(graph_bucket_step=)``).

A captured step pads its rows up to the next bucket; above ``step`` the ladder is linear, so a step pads fewer
than ``step`` rows where powers of two pad up to half. Checked here on the CPU (the ladder, the knob's
validation and resolution, eager steps ignoring it); tests/gpu/test_mixed_cuda.py replays graphs on the ladder
and serves on it with deterministic requests bit for bit.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llm42 import DVRGenerator
from llm42.cuda_graphs import row_buckets
from llm42.engine.config import COMPUTE_BOUND_HIDDEN, EngineConfig, default_graph_bucket_step
from llm42.model.config import llama31_8b_config
from llm42.model.weights import random_weights
from tests.helpers import tiny_config


def bucket_of(ladder: tuple[int, ...], num_rows: int) -> int:
    return next(b for b in ladder if b >= num_rows)


@given(max_rows=st.integers(1, 4096), step=st.one_of(st.none(), st.integers(1, 256).map(lambda k: 16 * k)))
def test_every_row_count_has_a_bucket_padding_less_than_the_step(max_rows, step):
    ladder = row_buckets(max_rows, step)
    assert list(ladder) == sorted(set(ladder)) and ladder[-1] == max_rows
    for num_rows in range(1, max_rows + 1):
        bucket = bucket_of(ladder, num_rows)
        if bucket == max_rows:
            continue
        if step is not None and num_rows > step:
            assert bucket - num_rows < step and bucket % step == 0
        else:  # powers of two from 16 (and the step itself): at most twice the rows
            assert bucket == 16 or bucket < 2 * num_rows
            assert bucket & (bucket - 1) == 0 or bucket == step


def test_powers_of_two_pad_more_than_a_linear_step():
    """The negative control of the bound above: the powers-of-two ladder pads 513 rows to 1,024."""
    assert bucket_of(row_buckets(2048), 513) == 1024
    assert bucket_of(row_buckets(2048, 256), 513) == 768
    assert row_buckets(2048, 256) == (16, 32, 64, 128, 256, 512, 768, 1024, 1280, 1536, 1792, 2048)
    assert row_buckets(2048, 4096) == row_buckets(2048)  # a step past the maximum: powers of two
    assert row_buckets(100, 48) == (16, 32, 48, 96, 100)


@pytest.mark.parametrize("value, error", [(24, ValueError), (0, ValueError), (-16, ValueError), (True, TypeError),
                                          ("256", TypeError), (256.0, TypeError)])
def test_a_bad_graph_bucket_step_is_refused_naming_it(value, error):
    with pytest.raises(error, match="graph_bucket_step"):
        EngineConfig(graph_bucket_step=value)
    cfg = tiny_config()
    with pytest.raises(error, match="graph_bucket_step"):
        DVRGenerator(random_weights(cfg, seed=0), cfg, graph_bucket_step=value)


def test_the_default_step_is_linear_on_compute_bound_models_only():
    big = llama31_8b_config(max_position_embeddings=2048, num_layers=1)
    small = tiny_config()
    assert big.hidden_size >= COMPUTE_BOUND_HIDDEN > small.hidden_size
    assert default_graph_bucket_step(big) == 128 and default_graph_bucket_step(small) is None
    assert EngineConfig().bucket_step(big) == 128
    assert EngineConfig(graph_bucket_step=64).bucket_step(big) == 64
    assert EngineConfig(graph_bucket_step=64).bucket_step(small) == 64


def test_eager_steps_run_exactly_their_rows_whatever_the_step():
    cfg = tiny_config()
    gen = DVRGenerator(random_weights(cfg, seed=0), cfg, graph_bucket_step=16, mixed_steps=True, max_num_seqs=8)
    mixed = gen.fast_step.mixed
    assert mixed.graphs is None and mixed.decode_buckets() == ()
    assert [mixed.decode_bucket(n) for n in (1, 5, 17)] == [1, 5, 17]
    assert gen.fast_step.fast_prefill.bucket_for(37) == 37
    gen.close()
