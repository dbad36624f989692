"""The fast decode attention's dispatch order (round 48): ``StepInputs.decode_order`` (longest context first),
the fast policy passing it only while ``DECODE_LONGEST_FIRST`` is on, and ``dvr_ab.py``'s ``KernelSwitches``
variants setting the launch's order (and round 50's fused sampler) when a generator is built. That the order
changes no bit is checked on the kernel itself (``tests/test_tiled_attention.py`` under Triton's interpreter,
``tests/gpu/test_tiled_attention.py``)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from llm42.inputs import StepInputs
from llm42.kernels import attention
from llm42.policies import fast
from tests.helpers import load_device_script


def decode_inputs(lens: list[int]) -> StepInputs:
    ctx = torch.tensor(lens, dtype=torch.int64)
    return StepInputs(token_ids=ctx, positions=ctx - 1, slot_mapping=ctx, row_seq=torch.arange(len(lens)),
                      block_tables=torch.zeros(len(lens), 1, dtype=torch.int64), context_lens=ctx,
                      seq_starts=tuple(range(len(lens) + 1)), max_context_len=max(lens))


@given(st.lists(st.integers(1, 50), min_size=1, max_size=40))
def test_decode_order_is_longest_context_first_ties_in_sequence_order(lens):
    inputs = decode_inputs(lens)
    order = inputs.decode_order
    assert order.tolist() == sorted(range(len(lens)), key=lambda s: (-lens[s], s))
    assert inputs.decode_order is order  # once per step: every layer's launch reads the same tensor


def test_fast_policy_passes_the_order_only_while_it_is_on(monkeypatch):
    inputs = decode_inputs([3, 9, 5])
    monkeypatch.setattr(attention, "DECODE_LONGEST_FIRST", True)
    assert fast._decode_order(inputs).tolist() == [1, 2, 0]
    monkeypatch.setattr(attention, "DECODE_LONGEST_FIRST", False)
    assert fast._decode_order(inputs) is None


def test_dvr_ab_sets_each_variants_switches_when_its_generator_is_built(monkeypatch):
    from llm42 import sampler
    from llm42.kernels import sampling

    dvr_ab = load_device_script("dvr_ab")
    seen = []

    class Engine:
        canonical_gemm = "cublas"
        canonical_tile_m = 64

        def generator(self):
            seen.append((attention.DECODE_HEAD_MAJOR, attention.DECODE_LONGEST_FIRST, sampler.FUSED_CUDA_SAMPLER,
                         sampling.GUMBEL_TARGET_PROGRAMS, sampling.GUMBEL_SKIP_GREEDY))

    monkeypatch.setattr(dvr_ab.dataclasses, "replace", lambda engine, **knobs: engine)
    monkeypatch.setattr(dvr_ab.KernelSwitches, "_tree", None)
    monkeypatch.setattr(sampler, "FUSED_CUDA_SAMPLER", True)
    monkeypatch.setattr(sampling, "GUMBEL_TARGET_PROGRAMS", 1024)  # the tree's defaults since round 51
    monkeypatch.setattr(sampling, "GUMBEL_SKIP_GREEDY", True)
    order = (attention.DECODE_HEAD_MAJOR, attention.DECODE_LONGEST_FIRST)
    for name in ("order_seq", "default", "sampler_unfused", "gumbel_plain", "admit_budget_gumbel_lean",
                 "admit_budget"):
        dvr_ab.engine_variant(Engine(), dvr_ab.VARIANTS[name]).generator()
    # a variant without a knob puts the tree's switch back
    tree = (*order, True, 1024, True)
    assert seen == [(False, False, *tree[2:]), tree, (*order, False, 1024, True), (*order, True, None, False), tree,
                    tree]
    assert (attention.DECODE_HEAD_MAJOR, attention.DECODE_LONGEST_FIRST, sampler.FUSED_CUDA_SAMPLER,
            sampling.GUMBEL_TARGET_PROGRAMS, sampling.GUMBEL_SKIP_GREEDY) == tree
    with pytest.raises(ValueError, match="decode_order"):
        dvr_ab.engine_variant(Engine(), {"decode_order": "sideways"})
