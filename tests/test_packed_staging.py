"""One pinned buffer, one copy (round 41): ``PackedStaging``'s regions, ``StaticRows`` staging into it, and a canonical
pass's and a fast prompt step's staging sent in one copy each.

Every engine test stages through this code, so a region that landed on the wrong bytes would fail them somewhere; what
these check directly: the regions do not overlap and alias one buffer each side, a partial copy carries exactly its
prefix (negative control: a region past it keeps its old bytes), ``send=False`` leaves the device untouched until
``send`` (negative control: before it the device differs), and a pass or a prompt step makes one copy, no more.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from llm42 import DVRGenerator, KVStore, SamplingParams
from llm42.cuda_graphs import PackedStaging, StaticRows
from llm42.model.weights import random_weights
from llm42.runner import Segment
from tests.helpers import tiny_config

CPU = torch.device("cpu")
REGIONS = (("a", (2, 5), torch.int64), ("b", (3,), torch.float32), ("c", (7,), torch.int64))


def test_regions_are_aligned_disjoint_views_of_one_buffer_each_side():
    packed = PackedStaging(REGIONS, CPU)
    spans = []
    for name, shape, dtype in REGIONS:
        dev, host = packed.device(name), packed.host(name)
        assert dev.shape == shape and dev.dtype == dtype and host.shape == shape
        assert packed.offset(name) % PackedStaging.ALIGN == 0
        start = dev.data_ptr() - packed._device.data_ptr()
        assert start == packed.offset(name)  # the device view is the buffer's own memory
        assert host.ctypes.data - packed._host.data_ptr() == start  # so is the host view, at the same offset
        spans.append((start, start + dev.numel() * dev.element_size()))
    spans.sort()
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))
    assert spans[-1][1] <= packed.nbytes


def test_a_partial_copy_carries_its_prefix_only():
    packed = PackedStaging(REGIONS, CPU)
    packed.host("a")[:] = np.arange(10).reshape(2, 5)
    packed.host("b")[:] = [0.5, 1.5, 2.5]
    packed.host("c")[:] = 9
    packed.copy(packed.offset("c"))  # a and b, not c
    assert packed.device("a").tolist() == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    assert packed.device("b").tolist() == [0.5, 1.5, 2.5]
    assert packed.device("c").tolist() == [0] * 7  # negative control: past the prefix, nothing moved
    packed.copy()
    assert packed.device("c").tolist() == [9] * 7


def _store_and_segments():
    cfg = tiny_config()
    kv = KVStore(cfg, num_blocks=32, block_size=4, num_scratch_slots=16)
    segments = []
    for rid, (start, n) in enumerate([(0, 3), (5, 1), (2, 6)]):
        kv.allocate(rid, start + n + 1)
        kv.append(rid, start + n)
        segments.append(Segment(rid, tuple(range(10, 10 + n)), start, SamplingParams(), 0))
    return kv, segments


def test_stage_without_send_leaves_the_device_until_send():
    kv, segments = _store_and_segments()
    sent = StaticRows(16, 64, kv, CPU, max_seqs=4)
    sent.stage_segments(kv, segments, num_rows=16)
    held = StaticRows(16, 64, kv, CPU, max_seqs=4)
    held.stage_segments(kv, segments, num_rows=16, send=False)
    assert not torch.equal(held.ints, sent.ints), "staging without send reached the device"  # negative control
    held.send()
    assert torch.equal(held.ints, sent.ints)
    assert torch.equal(held.block_tables, sent.block_tables)
    # the rows as the per-segment values say: positions, tokens, and each row's table from its own sequence
    assert held.view("positions", 10).tolist() == [0, 1, 2, 5, 2, 3, 4, 5, 6, 7]
    assert held.view("token_ids", 10).tolist() == [10, 11, 12, 10, 10, 11, 12, 13, 14, 15]
    for row, rid in enumerate([0, 0, 0, 1, 2, 2, 2, 2, 2, 2]):
        table = kv.block_table(rid)
        assert held.block_tables[row, : len(table)].tolist() == list(table)


def test_send_copies_the_staged_tables_and_no_more():
    kv, segments = _store_and_segments()
    rows = StaticRows(16, 64, kv, CPU, max_seqs=4)
    sizes = []
    copy = rows.packed.copy
    rows.packed.copy = lambda nbytes=None: (sizes.append(nbytes), copy(nbytes))
    rows.stage_segments(kv, segments, num_rows=16)
    width = max(len(kv.block_table(s.rid)) for s in segments)
    assert sizes == [rows.packed.offset("tables") + (len(segments) + 1) * width * 8]


class _Copies:
    def __init__(self, packed: PackedStaging):
        self.count = 0
        copy = packed.copy

        def counted(nbytes=None):
            self.count += 1
            copy(nbytes)

        packed.copy = counted


@pytest.mark.parametrize("wide", [False, True])
def test_a_canonical_pass_and_a_prompt_step_stage_in_one_copy(wide):
    cfg = tiny_config()
    gen = DVRGenerator(random_weights(cfg, seed=0), cfg, window=4, group=2, kv_cache_tokens=512, block_size=8,
                       max_fast_tokens=16, max_canonical_tokens=32)
    gen.generate([[5, 6, 7]], SamplingParams(max_new_tokens=2, deterministic=True))  # binds the pass's rows
    cpass = gen.verifier.canonical_pass
    copies = _Copies(cpass._rows.packed)
    kv = gen.kv
    kv.allocate(100, 40)
    kv.append(100, 20 if wide else 6)
    segment = Segment(100, tuple(range(3, 23 if wide else 9)), 0, SamplingParams(deterministic=True), 0)
    cpass.stage([segment], kv)
    assert copies.count == 1
    assert cpass._bucket > cpass.num_rows if wide else cpass._bucket == cpass.num_rows
    prefill = gen.fast_step.fast_prefill
    prompt_copies = _Copies(prefill._rows.packed)
    kv.allocate(101, 8)
    kv.append(101, 5)
    prefill.stage([Segment(101, (4, 5, 6, 7, 8), 0, SamplingParams(temperature=0.5, top_p=0.9), 3)], kv)
    assert prompt_copies.count == 1
    assert prefill._logits_rows[0].item() == 4
    assert prefill._sampling_floats[:, 0].tolist() == [0.5, pytest.approx(0.9)]
    assert prefill._sampling_ints[:, 0].tolist() == [0, 3, 5]
    gen.close()


def test_the_tile_table_goes_in_the_same_copy():
    """A canonical pass on CUDA stages a tile table too (``tile_rows``; never on the CPU engine, so staged here by
    hand): the device's table is ``tile_starts`` of the staged rows, sent with them."""
    from llm42.cuda_graphs import tile_starts

    kv, segments = _store_and_segments()
    rows = StaticRows(16, 64, kv, CPU, max_seqs=4, tile_rows=4)
    rows.stage_segments(kv, segments, num_rows=16)
    want = tile_starts(rows.view("segment", 16).numpy(), 4, 16)
    assert rows.tiles.tolist() == want.tolist()
    assert want[:4].tolist() == [0, 3, 4, 8]  # 3 rows, 1 row, 6 rows in tiles of 4: [0,3) [3,4) [4,8) [8,10) ...
    before = rows.tiles.clone()
    rows.stage_segments(kv, segments[:1], num_rows=16, send=False)
    assert torch.equal(rows.tiles, before)  # negative control: held back until send
    rows.send()
    assert rows.tiles.tolist() == tile_starts(rows.view("segment", 16).numpy(), 4, 16).tolist() != before.tolist()
