"""A canonical pass's sampling rows (``CanonicalPass._stage_sampling``) written per run of rows that share a
request's params and seed: the very rows a per-row list builds (round 22's way), padding rows greedy; and the runs
(``SamplingRuns``) of a pass's segments and of its wanted rows, against the per-row lists they stand for.

The engine tests compare runs that stage through the same code, so a wrong row here could pass them unnoticed;
this compares with per-row Python lists, and the negative control shows the comparison sees one wrong row.
"""

from __future__ import annotations

import random

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llm42 import DVRGenerator, SamplingParams
from llm42.model.weights import random_weights
from llm42.runner import Segment
from llm42.sampler import sampling_variant
from llm42.verify.sampling_runs import SamplingRuns
from tests.helpers import tiny_config

CFG = tiny_config()
GEN = DVRGenerator(random_weights(CFG, seed=0), CFG, window=4, group=2, kv_cache_tokens=512, block_size=8,
                   max_fast_tokens=16, max_canonical_tokens=16)
GEN.generate([[5, 6, 7]], SamplingParams(max_new_tokens=2, deterministic=True))  # binds the pass's buffers
PASS = GEN.verifier.canonical_pass


def _per_row_lists(per_row, num_results):
    pad = num_results - len(per_row)
    ints = torch.tensor([[p.top_k for p, _, _ in per_row] + [0] * pad, [s for _, s, _ in per_row] + [0] * pad,
                         [q for _, _, q in per_row] + [0] * pad], dtype=torch.int64)
    floats = torch.tensor([[p.temperature for p, _, _ in per_row] + [0.0] * pad,
                           [p.top_p for p, _, _ in per_row] + [1.0] * pad], dtype=torch.float32)
    return ints, floats, sampling_variant(p for p, _, _ in per_row)


def _staged(per_row, num_results):
    ints, floats = PASS._sampling_host()
    ints.fill(-7)
    floats.fill(-7.0)
    PASS._stage_sampling(SamplingRuns.of_rows(per_row), num_results)
    return (torch.from_numpy(ints[:, :num_results].copy()), torch.from_numpy(floats[:, :num_results].copy()),
            PASS._variant)


def _rows(seed: int, num_runs: int):
    rng = random.Random(seed)
    per_row = []
    for _ in range(num_runs):
        params = SamplingParams(deterministic=True, temperature=rng.choice([0.0, 0.7, 1.3, 0.1 + rng.random()]),
                                top_k=rng.choice([0, 5, 40]), top_p=rng.choice([1.0, 0.9, rng.random() or 0.5]),
                                seed=rng.randrange(1 << 20))
        seed_of_run = rng.randrange(1 << 40)
        start = rng.randrange(500)
        per_row += [(params, seed_of_run, start + i + 1) for i in range(rng.randint(1, 6))]
    return per_row


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), num_runs=st.integers(0, 3), extra=st.integers(0, 3))
def test_runs_of_rows_stage_what_per_row_lists_stage(seed, num_runs, extra):
    per_row = _rows(seed, num_runs)
    num_results = len(per_row) + extra
    if num_results == 0 or num_results > PASS.max_rows:
        return
    ints, floats, variant = _staged(per_row, num_results)
    want_ints, want_floats, want_variant = _per_row_lists(per_row, num_results)
    assert torch.equal(ints, want_ints) and torch.equal(floats, want_floats) and variant == want_variant


def test_a_run_split_by_its_seed_alone_is_staged_row_by_row():
    """Rows of one params object whose seeds differ (n > 1 samples share params, not seeds): each keeps its seed.
    Negative control: a per-run writer keyed on the params object alone (seeds repeated from a run's first row)
    stages other rows on this input, so the input does test the case."""
    params = SamplingParams(deterministic=True, temperature=0.8, seed=1)
    per_row = [(params, 11, 5), (params, 11, 6), (params, 12, 7), (params, 11, 8)]
    ints, _, _ = _staged(per_row, len(per_row))
    want, _, _ = _per_row_lists(per_row, len(per_row))
    assert torch.equal(ints, want)
    keyed_on_params = [(p, per_row[0][1], q) for p, _, q in per_row]  # what that writer would stage
    assert not torch.equal(_per_row_lists(keyed_on_params, len(per_row))[0], want)


def _expand(runs: SamplingRuns) -> list:
    rows = []
    for params, seed, count in zip(runs.params, runs.seeds.tolist(), runs.counts.tolist()):
        rows += [(params, seed)] * count
    return [(p, s, q) for (p, s), q in zip(rows, runs.positions.tolist(), strict=True)]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), num_segments=st.integers(0, 5), data=st.data())
def test_runs_of_segments_and_of_wanted_rows_are_the_per_row_lists(seed, num_segments, data):
    """``SamplingRuns.of_segments`` is the verifier's old per-row list ((params, seed, position + 1) per row), and
    ``take`` of any distinct rows is that list at those rows, in their order. Negative control: the positions off by
    one (the row's own position, not the sampled token's) differ from it."""
    rng = random.Random(seed)
    segments = []
    for rid in range(num_segments):
        params = SamplingParams(deterministic=True, temperature=rng.choice([0.0, 0.8]), seed=rid)
        segments.append(Segment(rid, tuple(rng.randrange(3, 100) for _ in range(rng.randint(1, 7))),
                                rng.randrange(300), params, rng.randrange(1 << 30)))
    per_row = [(seg.params, seg.seed, pos + 1) for seg in segments for pos in range(seg.start, seg.end)]
    runs = SamplingRuns.of_segments(segments)
    assert _expand(runs) == per_row
    rows = data.draw(st.lists(st.integers(0, max(len(per_row) - 1, 0)), unique=True, max_size=len(per_row)))
    if not per_row:
        rows = []
    taken = runs.take(np.array(rows, dtype=np.int64))
    assert _expand(taken) == [per_row[r] for r in rows]
    if per_row:
        assert [(p, s, q - 1) for p, s, q in _expand(runs)] != per_row
