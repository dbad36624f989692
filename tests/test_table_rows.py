"""The tiled kernels' CPU-side plumbing: StaticRows stages one block-table row per sequence
(``StepInputs.table_rows``), and FixedShapePolicy's ``attention_kernel`` knob."""

from __future__ import annotations

import pytest
import torch

from llm42 import KVStore, SamplingParams
from llm42.cuda_graphs import StaticRows
from llm42.policies import FixedShapePolicy
from llm42.runner import Segment
from tests.helpers import tiny_config


def test_static_rows_stage_one_table_row_per_sequence():
    """StaticRows gives every row its own table copy and, in table_rows, its sequence's first row."""
    cfg = tiny_config()
    kv = KVStore(cfg, num_blocks=16, block_size=4, num_scratch_slots=12)
    rows = StaticRows(12, 8, kv, torch.device("cpu"))
    segments = []
    for rid, (start, n) in enumerate([(0, 3), (0, 1), (0, 4)]):
        kv.allocate(rid, n + 1)
        kv.append(rid, n)
        segments.append(Segment(rid, tuple(range(n)), start, SamplingParams(), 0))
    rows.stage_segments(kv, segments)
    table_rows = rows.view("table_rows", 12)
    assert table_rows.tolist() == [0, 0, 0, 3, 4, 4, 4, 4] + [8] * 4
    assert torch.equal(rows.block_tables[table_rows], rows.block_tables)


def test_fixed_shape_policy_attention_kernel_knob():
    assert FixedShapePolicy().attention_kernel == "tiled"
    assert repr(FixedShapePolicy()) == "FixedShapePolicy(key_block=64)"
    assert repr(FixedShapePolicy(attention_kernel="rows")) == "FixedShapePolicy(key_block=64, attention_kernel='rows')"
    with pytest.raises(ValueError, match="attention_kernel"):
        FixedShapePolicy(attention_kernel="flash")
