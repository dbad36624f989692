"""The canonical pass is shape-closed: a row's logits (and the K/V it writes) are bit-identical
whatever else fills the pass and wherever the row sits; the fast path is not."""

import random

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given

from llm42 import KVStore, SamplingParams
from llm42.model.forward import forward
from llm42.model.weights import random_weights
from llm42.policies import FastPolicy, FixedShapePolicy
from llm42.runner import ModelRunner, Segment
from llm42.verify import commit_window
from tests.helpers import wide_config

CFG = wide_config()
WEIGHTS = random_weights(CFG, seed=11)
RUNNER = ModelRunner(WEIGHTS, CFG)
PARAMS = SamplingParams()
NUM_ROWS = 48  # > the largest layout the property draws (12 + 3 * 6 + 2 * 6 rows)


def canonical_logits(layout: list[list[int]], needle: int, policy=None, num_rows=NUM_ROWS):
    """Run one canonical pass over prompts laid out in order; return (logits, kv rows) of prompt ``needle``."""
    kv = KVStore(CFG, num_blocks=64, block_size=8, num_scratch_slots=num_rows)
    segments = []
    for rid, prompt in enumerate(layout):
        kv.allocate(rid, len(prompt) + 1)
        kv.append(rid, len(prompt))
        segments.append(Segment(rid, tuple(prompt), 0, PARAMS, 0))
    inputs = RUNNER.canonical_inputs(segments, kv, num_rows)
    logits = forward(WEIGHTS, CFG, inputs, kv.layers(), policy or FixedShapePolicy())
    start = sum(len(p) for p in layout[:needle])
    rows = logits[start: start + len(layout[needle])]
    slots = torch.tensor(kv.slots(needle, 0, len(layout[needle])))
    return rows, kv.layers().k[1][slots].clone()


@given(needle_len=st.integers(1, 12), before=st.lists(st.integers(1, 6), max_size=3),
       after=st.lists(st.integers(1, 6), max_size=2), seed=st.integers(0, 10_000))
def test_row_logits_and_kv_independent_of_pass_contents_and_row_position(needle_len, before, after, seed):
    rng = random.Random(seed)
    needle = [rng.randrange(CFG.vocab_size) for _ in range(needle_len)]
    others = [[rng.randrange(CFG.vocab_size) for _ in range(n)] for n in before + after]
    alone_logits, alone_kv = canonical_logits([needle], 0)
    layout = others[: len(before)] + [needle] + others[len(before):]
    mixed_logits, mixed_kv = canonical_logits(layout, len(before))
    assert torch.equal(alone_logits, mixed_logits)
    assert torch.equal(alone_kv, mixed_kv)


def test_fast_path_rows_drift_with_batch_composition():
    """Negative control: the same comparison through FastPolicy (varying M) finds differences."""
    rng = random.Random(0)
    needle = [rng.randrange(CFG.vocab_size) for _ in range(4)]
    kv = KVStore(CFG, num_blocks=256, block_size=8, num_scratch_slots=8)
    distinct = set()
    for num_others in range(0, 40, 3):
        layout = [[rng.randrange(CFG.vocab_size) for _ in range(rng.randrange(1, 8))] for _ in range(num_others)]
        layout.append(needle)
        segments = []
        for rid, prompt in enumerate(layout):
            kv.allocate(rid, len(prompt))
            kv.append(rid, len(prompt))
            segments.append(Segment(rid, tuple(prompt), 0, PARAMS, 0))
        logits = forward(WEIGHTS, CFG, RUNNER.fast_inputs(segments, kv), kv.layers(), FastPolicy())
        distinct.add(logits[-1].numpy().tobytes())
        for rid in range(len(layout)):
            kv.free(rid)
    assert len(distinct) >= 2, "CPU GEMMs should drift with the batch size for a hidden-512 fp32 model"


def test_commit_rule_accepts_matching_prefix_then_first_canonical_token():
    seg = Segment(0, (10, 11, 12, 13), 5, PARAMS, 0)  # last committed 10, candidates 11 12 13
    commit = commit_window(seg, sampled=[11, 12, 99, 7], logprobs=[-0.1, -0.2, -0.3, -0.4])
    assert commit.token_ids == (11, 12, 99)
    assert commit.logprobs == (-0.1, -0.2, -0.3)
    assert (commit.num_accepted, commit.num_rejected) == (2, 1)
    assert commit.num_kv_valid == 5 + 3  # positions 0..7: the committed token and the two accepted ones


def test_commit_rule_all_accepted_adds_bonus_token():
    seg = Segment(0, (10, 11, 12), 0, PARAMS, 0)
    commit = commit_window(seg, sampled=[11, 12, 42], logprobs=[-1.0, -2.0, -3.0])
    assert commit.token_ids == (11, 12, 42) and commit.num_rejected == 0


def test_commit_rule_empty_window_commits_one_canonical_token():
    seg = Segment(0, (10,), 3, PARAMS, 0)
    commit = commit_window(seg, sampled=[8], logprobs=[-0.5])
    assert commit.token_ids == (8,) and commit.num_accepted == 0 and commit.num_kv_valid == 4


def test_host_int64_is_torch_tensor_of_the_list():
    from llm42.cuda_graphs import host_int64

    for values in ([], [0], [3, -1, 2**62, -(2**62)], list(range(2048))):
        got = host_int64(values)
        assert got.dtype == torch.int64 and got.device.type == "cpu"
        assert torch.equal(got, torch.tensor(values, dtype=torch.int64))


@given(runs=st.lists(st.integers(1, 50), min_size=1, max_size=12), per_tile=st.sampled_from([1, 5, 21, 32]),
       repeat=st.booleans())
def test_tile_starts_cut_each_run_into_tiles_of_its_own(runs, per_tile, repeat):
    """``tile_starts``: tiles cover the rows in order, each within one run of equal ids and at most ``per_tile``
    rows; past the last tile, empty tiles; a table too small for the runs' tiles is refused, one of the row
    count's entries never is."""
    import numpy as np

    from llm42.cuda_graphs import tile_starts

    ids = [i % 2 if repeat else i for i, n in enumerate(runs) for _ in range(n)]  # repeat: ids come back
    groups = np.array(ids, dtype=np.int64)
    n = len(ids)
    size = -(-n // per_tile) + len(runs)
    table = tile_starts(groups, per_tile, size)
    assert table.shape == (size + 1,) and table[0] == 0 and table[-1] == n
    assert (np.diff(table) >= 0).all()
    used = [int(t) for t in table if t < n]
    for lo, hi in zip(used, used[1:] + [n]):
        assert 0 < hi - lo <= per_tile and len(set(ids[lo:hi])) == 1
    needed = sum(-(-r // per_tile) for r in runs)
    assert len(used) == needed
    # a table of only the fixed tiling's length is refused where the runs need more tiles (a tile spanning two
    # runs would be computed as one sequence's); the row count's length always holds them
    fixed = -(-n // per_tile)
    if needed > fixed:
        with pytest.raises(ValueError, match="tile_starts: the runs need"):
            tile_starts(groups, per_tile, fixed)
    else:
        assert list(tile_starts(groups, per_tile, fixed)[:needed]) == used
    assert list(tile_starts(groups, per_tile, n)[:needed]) == used


def test_static_rows_stage_a_tile_table_per_pass():
    """A pass's staged rows carry the tile table of their sequences (a window per sequence, then padding);
    without ``tile_rows``, none (the other layouts)."""
    from llm42.cuda_graphs import StaticRows

    kv = KVStore(CFG, num_blocks=64, block_size=8, num_scratch_slots=NUM_ROWS)
    rows = StaticRows(NUM_ROWS, 64, kv, torch.device("cpu"), max_seqs=4, tile_rows=5)
    assert StaticRows(NUM_ROWS, 64, kv, torch.device("cpu")).inputs(NUM_ROWS, max_context_len=1,
                                                                    logits_rows=None).tiles is None
    lengths = [7, 3, 12]
    tokens, positions, slots, tables, table_of_row = [], [], [], [], []
    for rid, n in enumerate(lengths):
        kv.allocate(rid, n)
        kv.append(rid, n)
        tokens += [1] * n
        positions += range(n)
        slots += kv.slots(rid, 0, n)
        tables.append(kv.block_table(rid))
        table_of_row += [rid] * n
    rows.stage(kv, tokens, positions, slots, tables, table_of_row, num_rows=32)
    tiles = rows.inputs(32, max_context_len=12, logits_rows=None).tiles
    # 7 = 5 + 2, 3, 12 = 5 + 5 + 2, then 10 padding rows = 5 + 5; the rest empty (the row count)
    want = [0, 5, 7, 10, 15, 20, 22, 27]
    assert tiles.tolist() == want + [32] * (32 + 1 - len(want))
