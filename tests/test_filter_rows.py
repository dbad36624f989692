"""A step's few top-k / top-p rows listed for the sampler (``DecodeState.stage_batch`` -> ``filter_rows``).

A decode step with more rows than ``DecodeState.filter_slots`` and at most that many filtered rows stages their
batch rows in a static index; the sampler sorts those rows only (``SamplingRows.filter_rows``), in decode steps and
mixed steps alike. CUDA graphs replay the same staging (``FILTER_LISTED`` is a variant of its own); here it runs
eagerly, so the CPU suite tests the index the GPU reads. tests/test_sampler.py proves the sampler's side;
tests/test_sampling_kernels.py (GPU) the same on CUDA, replayed from a graph.
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

import llm42.verify.canonical_pass as canonical_pass
from llm42 import sampler
from llm42 import DVRGenerator, SamplingParams
from llm42.engine.decode_state import DecodeState
from llm42.model.weights import random_weights
from llm42.sampler import FILTER_LISTED, FILTER_PADDING
from tests.helpers import tiny_config

CFG = tiny_config()
WEIGHTS = random_weights(CFG, seed=9)


def _serve(monkeypatch, filter_slots: int, mixed_steps: bool, *, drop_first: bool = False, model=(CFG, WEIGHTS)):
    """Sixteen requests, two free ones with top-p / top-k and one deterministic with top-k, the rest plain; the
    outputs and how many steps listed their filtered rows."""
    monkeypatch.setattr(sampler, "FILTER_SLOTS", filter_slots)
    listed = []
    original = DecodeState.listed_rows

    def spy(self, batch, num_rows):
        rows = original(self, batch, num_rows)
        if rows is not None:
            listed.append(len(rows))
            if drop_first:  # the negative control: the first filtered row goes unlisted
                rows = rows[1:] if len(rows) > 1 else np.array([num_rows], dtype=np.int64)
        return rows

    monkeypatch.setattr(DecodeState, "listed_rows", spy)
    cfg, weights = model
    rng = random.Random(3)
    prompts = [[rng.randrange(cfg.vocab_size) for _ in range(rng.randrange(2, 20))] for _ in range(16)]
    params = [SamplingParams(max_new_tokens=10, temperature=0.9, seed=i, ignore_eos=True, logprobs=True)
              for i in range(16)]
    params[3] = SamplingParams(max_new_tokens=10, temperature=1.1, top_p=0.6, seed=3, ignore_eos=True, logprobs=True)
    params[8] = SamplingParams(max_new_tokens=10, temperature=0.8, top_k=4, seed=8, ignore_eos=True, logprobs=True)
    params[12] = SamplingParams(max_new_tokens=10, temperature=0.8, top_k=3, seed=12, ignore_eos=True,
                                deterministic=True)
    gen = DVRGenerator(weights, cfg, window=3, group=2, max_num_seqs=16, max_fast_tokens=64, kv_cache_tokens=4096,
                       mixed_steps=mixed_steps)
    rids = [gen.submit(p, q) for p, q in zip(prompts, params)]
    while gen.has_unfinished():
        gen.step()
    return [gen.result(r) for r in rids], listed, gen.stats


@pytest.mark.parametrize("mixed_steps", [False, True])
def test_listed_filter_rows_serve_what_filtering_every_row_serves(monkeypatch, mixed_steps, model=(CFG, WEIGHTS)):
    """tests/gpu/test_filter_rows_cuda.py runs this on CUDA (``model`` there: the 8B shape), from graphs."""
    reference, never, unlisted = _serve(monkeypatch, 0, mixed_steps, model=model)  # slots 0: none lists its rows
    assert never == [] and unlisted["listed_filter_steps"] == 0 and unlisted["filtered_steps"] > 0
    served, listed, stats = _serve(monkeypatch, 3, mixed_steps, model=model)
    assert listed and max(listed) >= 2  # steps did list their filtered rows, several at once
    assert 0 < stats["listed_filter_steps"] <= stats["filtered_steps"] == unlisted["filtered_steps"]
    if mixed_steps:
        assert stats["mixed_steps"] >= 1
    for a, b in zip(reference, served):
        assert a.token_ids == b.token_ids and a.logprobs == b.logprobs
    # control: a list that misses a filtered row draws that row from its whole distribution
    wrong, _, _ = _serve(monkeypatch, 3, mixed_steps, drop_first=True, model=model)
    assert any(a.token_ids != b.token_ids for a, b in zip(reference, wrong))
    assert wrong[12].token_ids == reference[12].token_ids  # the deterministic request's canonical pass decides


def test_a_bucket_no_larger_than_the_slots_filters_every_row():
    """``listed_rows``: None where listing saves nothing (a step of at most ``filter_slots`` rows), with no filtered
    row, or with more filtered rows than slots; else the batch rows of the filtered slots, in batch order."""
    from llm42 import KVStore
    from llm42.policies import FastPolicy

    kv = KVStore(CFG, num_blocks=128, block_size=8, num_scratch_slots=8)
    state = DecodeState(WEIGHTS, CFG, kv, FastPolicy(), max_num_seqs=80)
    for slot in range(80):
        top_p = 0.5 if slot in (70, 4, 9) else 1.0
        kv.allocate(slot, 1)
        state.admit(slot, slot, SamplingParams(temperature=0.7, top_p=top_p, seed=slot), slot)
    batch = np.array([70, 1, 4, 2, 9], dtype=np.int64)
    assert state.listed_rows(batch, state.filter_slots) is None
    assert list(state.listed_rows(batch, state.filter_slots + 1)) == [0, 2, 4]
    assert state.listed_rows(np.array([1, 2, 3]), 80) is None
    assert state.stage_batch([70, 1, 4, 2, 9], 80) == (True, FILTER_LISTED)
    assert state.filter_rows[:4].tolist() == [0, 2, 4, FILTER_PADDING]
    assert state.stage_batch([70, 1, 4, 2, 9], 5) == (True, True)
    state.filter_slots = 2
    assert state.listed_rows(batch, 80) is None  # three filtered rows: more than the slots


def _verify(monkeypatch, filter_slots: int, *, drop_first: bool = False):
    """Eight deterministic requests through canonical passes of R = 8 rows, three with top-k / top-p (one with
    processed log-probs); the outputs and the filtered counts of the passes that listed their rows."""
    monkeypatch.setattr(sampler, "FILTER_SLOTS", filter_slots)
    listed = []
    original = canonical_pass.CanonicalPass._stage_sampling

    def spy(self, runs, num_results):
        original(self, runs, num_results)
        if self._variant[1] == FILTER_LISTED:
            rows = self._rows.packed.host("filter_rows")
            listed.append(int((rows < num_results).sum()))
            if drop_first:  # the negative control: the first filtered result row goes unlisted
                rows[0] = FILTER_PADDING

    monkeypatch.setattr(canonical_pass.CanonicalPass, "_stage_sampling", spy)
    rng = random.Random(5)
    prompts = [[rng.randrange(3, CFG.vocab_size) for _ in range(rng.randrange(2, 12))] for _ in range(8)]
    params = [SamplingParams(max_new_tokens=12, temperature=0.9, seed=i, ignore_eos=True, deterministic=True,
                             logprobs=2) for i in range(8)]
    params[1] = dataclasses.replace(params[1], top_p=0.5, logprobs_mode="processed")
    params[4] = dataclasses.replace(params[4], top_k=3)
    params[6] = dataclasses.replace(params[6], top_k=5, top_p=0.8)
    gen = DVRGenerator(WEIGHTS, CFG, window=4, group=2, max_num_seqs=8, max_fast_tokens=64, kv_cache_tokens=4096)
    return [(c.token_ids, c.logprobs, c.top_logprobs) for c in gen.generate(prompts, params)], listed


def test_canonical_passes_that_list_their_filtered_rows_commit_the_same_bits(monkeypatch):
    """The canonical pass lists its few top-k / top-p result rows too (``CanonicalPass._stage_sampling``): the
    same committed tokens, log-probs (processed ones included) and alternatives. Control: a listing that misses
    a filtered row commits another token for it, so the pass really reads the list."""
    reference, never = _verify(monkeypatch, 0)
    assert never == []
    served, listed = _verify(monkeypatch, 4)  # a window's rows are 4 of a pass's 8: one filtered request
    assert listed and max(listed) >= 2
    assert served == reference
    wrong, _ = _verify(monkeypatch, 4, drop_first=True)
    assert wrong != reference


def test_the_listed_variant_is_captured_only_where_a_step_lists(monkeypatch):
    """The graphs captured up front (``FastStep.decode_variants``, ``CanonicalPass.sampler_variants``) include the
    listed filter's variant exactly for the shapes ``stage_batch`` / ``_stage_sampling`` list at: more rows than
    ``filter_slots`` (the canonical pass: at most R result rows); none at all with ``filter_slots`` 0."""
    from llm42.engine.mixed import MixedStep

    listed = (True, FILTER_LISTED)
    for slots in (4, 0):
        monkeypatch.setattr(sampler, "FILTER_SLOTS", slots)
        gen = DVRGenerator(WEIGHTS, CFG, window=4, group=2, max_num_seqs=16, kv_cache_tokens=1024)
        step, cp = gen.fast_step, gen.verifier.canonical_pass
        for bucket in (2, 4, 5, 16):
            assert (listed in step.decode_variants(bucket)) == (0 < slots < bucket)
            mixed = step.decode_variants(bucket, MixedStep.MIXED_VARIANTS)
            assert (True, True) in mixed and (listed in mixed) == (0 < slots < bucket)
            assert len(step.decode_variants(bucket)) == 3 + (0 < slots < bucket)
        for results in (3, 5, 8, 16):  # R = 8
            assert (listed in cp.sampler_variants(results)) == (0 < slots < results <= 8)
