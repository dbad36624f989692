"""The tiled attention kernels on the CPU, through Triton's interpreter, at small shapes.

Runs where Triton imports and there is no CUDA device (``tests/triton_cpu.py``); on a GPU machine the
same checks run at model shapes in ``tests/gpu/test_tiled_attention.py``.
"""

from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("triton")

from tests import triton_cpu  # noqa: E402

if not triton_cpu.is_interpreted():
    pytest.skip("Triton kernels are not interpreted here (a CUDA device: tests/gpu covers them)",
                allow_module_level=True)

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from llm42.kernels import (  # noqa: E402
    chunked_canonical_attention, chunked_canonical_decode_attention, tiled_canonical_attention,
    tiled_prefill_attention,
)
from llm42.kernels.tiled_attention import PREFILL_LARGE, PREFILL_SMALL, kv_tma_fits, prefill_config  # noqa: E402
from tests.tiled_attention_checks import (  # noqa: E402
    Cache, _bits, check_canonical_rows_are_their_own, check_decode_launch_has_canonical_bits,
    check_chunked_decode_has_canonical_bits, check_decode_order_keeps_the_bits,
    check_deterministic_rows_take_canonical_bits,
    check_kv_independent_of_chunking, check_kv_tma_keeps_the_bits, check_launch_keeps_the_bits,
    check_matches_float64,
    check_tile_table_keeps_the_bits, check_unmasked_full_blocks_keep_the_bits, mixed_rows, prefill_kernel,
)

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
# (num_heads, num_kv_heads, head_dim, block_size, sliding_window): GQA 2:1 with a window, 3:1 with a head dim
# that is not a power of two, 1:1
SHAPES = [(4, 2, 16, 8, 11), (6, 2, 24, 4, None), (2, 2, 32, 16, None)]


def small_cache(shape, dtype, seed, *, num_seqs=3, max_context=48):
    num_heads, num_kv_heads, head_dim, block_size, _ = shape
    return Cache(num_seqs=num_seqs, max_context=max_context, num_heads=num_heads, num_kv_heads=num_kv_heads,
                 head_dim=head_dim, block_size=block_size, dtype=dtype, device="cpu", seed=seed)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(str(v) for v in s))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kernel", ["prefill", "canonical"])
def test_tiled_kernels_match_float64(kernel, dtype, shape):
    cache = small_cache(shape, dtype, seed=len(shape) + DTYPES.index(dtype))
    rows = mixed_rows(cache, random.Random(3), num_chunks=3, num_decode=3)
    if kernel == "prefill":  # 16 M-rows and 16 keys: several tiles, groups and unmasked interior blocks
        check_matches_float64(cache, prefill_kernel((16, 16, 4, 2)), rows, sliding_window=shape[4])
    else:
        check_matches_float64(cache, tiled_canonical_attention, rows, sliding_window=shape[4], key_block=16)


def test_prefill_default_config_matches_float64():
    cache = small_cache(SHAPES[0], torch.float32, seed=9)
    rows = mixed_rows(cache, random.Random(4), num_chunks=2, num_decode=2)
    check_matches_float64(cache, tiled_prefill_attention, rows)


def test_prefill_config_follows_the_launch():
    assert prefill_config(16, 4) == PREFILL_SMALL
    assert prefill_config(8192, 4) == PREFILL_LARGE
    assert prefill_config(1, 128)[0] == 128  # at least one query row per tile


@settings(max_examples=4)
@given(seed=st.integers(0, 10_000), window=st.sampled_from([None, 9]), key_block=st.sampled_from([16, 32]))
@pytest.mark.parametrize("mask_every_block", [True, False], ids=["masked", "unmasked_full"])
def test_canonical_row_bits_do_not_depend_on_the_launch(mask_every_block, seed, window, key_block):
    """A row alone and next to longer and shorter rows of its sequence, other sequences, at any index,
    in any tile, varlen or static layout: the same bits (with every key block masked, and with the full
    blocks unmasked)."""
    cache = small_cache((4, 2, 16, 8, window), torch.bfloat16, seed=seed, max_context=80)
    compared = check_canonical_rows_are_their_own(cache, random.Random(seed), num_probes=3, num_launches=2,
                                                  max_neighbours=12, key_block=key_block, sliding_window=window,
                                                  mask_every_block=mask_every_block)
    assert compared >= 2


@pytest.mark.parametrize("window", [None, 7])
def test_canonical_kv_does_not_depend_on_chunking(window):
    cache = small_cache((4, 2, 16, 8, window), torch.bfloat16, seed=21, num_seqs=2, max_context=40)
    check_kv_independent_of_chunking(cache, [[40], [5, 13, 22], [17, 1, 22]], key_block=16, sliding_window=window)


def test_prefill_rows_of_a_tile_with_several_groups():
    """Rows of three sequences in one 64-M-row tile (and a sequence split across tiles) all get their own keys."""
    cache = small_cache(SHAPES[1], torch.float32, seed=5)
    rows = [(0, 40), (1, 3), (0, 41), (2, 0), (1, 4), (1, 5)] + [(2, p) for p in range(1, 30)]
    check_matches_float64(cache, tiled_prefill_attention, rows)
    check_matches_float64(cache, tiled_canonical_attention, rows, key_block=16)


def test_canonical_kernel_rejects_bad_configs():
    cache = small_cache(SHAPES[0], torch.float32, seed=1)
    with pytest.raises(ValueError, match="power of two"):
        cache.run(tiled_canonical_attention, [(0, 3)], key_block=24)
    with pytest.raises(ValueError, match="block_m"):
        cache.run(prefill_kernel((8, 16, 4, 2)), [(0, 3)])
    empty = cache.run(tiled_canonical_attention, [(0, 3)])[:0]
    assert empty.shape[0] == 0


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(str(v) for v in s))
@pytest.mark.parametrize("key_block", [16, 32])
def test_decode_launch_gives_decode_rows_the_canonical_bits(shape, key_block):
    cache = small_cache(shape, torch.bfloat16, seed=11, num_seqs=5)
    check_decode_launch_has_canonical_bits(cache, random.Random(3), num_rows=5, key_block=key_block,
                                           sliding_window=shape[4])


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(str(v) for v in s))
@pytest.mark.parametrize("num_splits", [1, 3])
def test_deterministic_rows_take_the_canonical_bits(shape, num_splits):
    """FastPolicy(decode_kernel="deterministic"): the flagged rows of a decode batch get the canonical decode
    launch's bits, the others the split kernel's, each launch leaving the other's rows alone."""
    cache = small_cache(shape, torch.bfloat16, seed=13, num_seqs=6)
    assert 1 <= check_deterministic_rows_take_canonical_bits(cache, random.Random(num_splits), key_block=16,
                                                             num_splits=num_splits, sliding_window=shape[4]) < 6


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(str(v) for v in s))
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_program_order_keeps_the_bits(shape, num_splits):
    """The split decode kernel's grid order and dispatch order (longest context first) are scheduling only."""
    cache = small_cache(shape, torch.bfloat16, seed=17, num_seqs=5)
    check_decode_order_keeps_the_bits(cache, random.Random(num_splits), num_splits=num_splits,
                                      sliding_window=shape[4])


def test_row_selection_is_checked():
    from llm42.kernels import paged_decode_attention

    cache = small_cache(SHAPES[0], torch.float32, seed=14, num_seqs=3)
    q, _, _, _ = cache.layout([(s, 5) for s in range(3)], static=False)
    lens = torch.full((3,), 6, dtype=torch.int64)
    with pytest.raises(ValueError, match="row selection"):
        paged_decode_attention(q, cache.k, cache.v, cache.tables, lens, block_size=cache.block_size,
                               scale=cache.scale, num_splits=1, skip_rows=torch.zeros(2, dtype=torch.int8))
    with pytest.raises(ValueError, match="out must be"):
        paged_decode_attention(q, cache.k, cache.v, cache.tables, lens, block_size=cache.block_size,
                               scale=cache.scale, num_splits=1, out=torch.empty(3, 1))
    with pytest.raises(ValueError, match="order must be"):
        paged_decode_attention(q, cache.k, cache.v, cache.tables, lens, block_size=cache.block_size,
                               scale=cache.scale, num_splits=1, order=torch.zeros(2, dtype=torch.int64))


def test_decode_launch_check_can_fail():
    """Negative control: the same check against another key block (other canonical bits) fails."""
    from llm42.kernels import tiled_canonical_decode_attention

    cache = small_cache(SHAPES[1], torch.bfloat16, seed=12, num_seqs=4, max_context=64)
    rows = [(s, 40 + s) for s in range(4)]
    q, _, _, _ = cache.layout(rows, static=False)
    lens = torch.tensor([p + 1 for _, p in rows])
    decode = tiled_canonical_decode_attention(q, cache.k, cache.v, cache.tables, lens, block_size=cache.block_size,
                                              scale=cache.scale, key_block=16)
    other = cache.run(tiled_canonical_attention, rows, key_block=32)
    assert not torch.equal(decode.view(torch.int16), other.view(torch.int16))


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(str(v) for v in s))
def test_unmasked_full_blocks_keep_the_canonical_bits(shape):
    """The canonical launch with the blocks a group sees in full unmasked gives every row the bits of the
    launch that masks every block (what lets CANONICAL_MASK_EVERY_BLOCK change without changing a bit)."""
    cache = small_cache(shape, torch.bfloat16, seed=31, max_context=96)
    # a window wider than the shape's 11 keys: with key blocks of 16 (the least) a group would see none in full
    window = None if shape[4] is None else 64
    compared = check_unmasked_full_blocks_keep_the_bits(cache, random.Random(5), num_launches=2, key_block=16,
                                                        sliding_window=window)
    assert compared >= 20  # rows that ran an unmasked block


def test_unmasked_full_blocks_check_can_fail():
    """Negative control: the same check against another key block (other canonical bits) fails."""
    cache = small_cache(SHAPES[1], torch.bfloat16, seed=32, max_context=96)
    with pytest.raises(AssertionError):
        check_unmasked_full_blocks_keep_the_bits(cache, random.Random(6), num_launches=1, key_block=16,
                                                 other=dict(key_block=32))


def _chunked(key_chunk):
    def kernel(*args, **kwargs):
        return chunked_canonical_attention(*args, key_chunk=key_chunk, **kwargs)
    return kernel


def chunk_cache(shape, seed, *, num_seqs=5):
    return small_cache(shape, torch.bfloat16, seed=seed, num_seqs=num_seqs, max_context=96)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(str(v) for v in s))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_chunked_canonical_matches_float64(dtype, shape):
    cache = small_cache(shape, dtype, seed=41, max_context=96)
    rows = mixed_rows(cache, random.Random(7), num_chunks=3, num_decode=3)
    check_matches_float64(cache, _chunked(32), rows, sliding_window=shape[4], key_block=16)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(str(v) for v in s))
def test_chunked_canonical_rows_are_their_own(shape):
    """The chunked launch keeps the canonical kernel's contract: a row alone and among any others, same bits."""
    cache = chunk_cache(shape, seed=42)
    compared = check_canonical_rows_are_their_own(cache, random.Random(8), num_probes=4, num_launches=3,
                                                  max_neighbours=5, key_block=16, sliding_window=shape[4],
                                                  kernel=_chunked(32))
    assert compared == 12


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(str(v) for v in s))
@pytest.mark.parametrize("key_chunk", [32, 64])
def test_chunked_decode_gives_decode_rows_the_canonical_bits(shape, key_chunk):
    """Each decode row's chunks in their own programs, folded by a second kernel: the canonical pass's bits."""
    cache = chunk_cache(shape, seed=43, num_seqs=6)
    spanning = check_chunked_decode_has_canonical_bits(cache, random.Random(key_chunk), key_block=16,
                                                       key_chunk=key_chunk, sliding_window=shape[4])
    assert spanning >= 1  # rows whose context is cut into several chunks: the fold is exercised


def test_chunked_bits_depend_on_the_chunk():
    """Negative controls: the chunk is part of the canonical config (another chunk, or the tiled kernel, gives
    some row other bits), so the checks above compare launches that could differ."""
    cache = chunk_cache(SHAPES[1], seed=44)
    rows = mixed_rows(cache, random.Random(9), num_chunks=3, num_decode=4)
    by_32 = cache.run(_chunked(32), rows, key_block=16)
    assert not torch.equal(by_32.view(torch.int16), cache.run(_chunked(64), rows, key_block=16).view(torch.int16))
    tiled = cache.run(tiled_canonical_attention, rows, key_block=16)
    assert not torch.equal(by_32.view(torch.int16), tiled.view(torch.int16))
    seqs = list(range(cache.num_seqs))
    positions = [60 + s for s in seqs]
    q, _, _, _ = cache.layout(list(zip(seqs, positions)), static=False)
    lens = torch.tensor([p + 1 for p in positions])
    decode = chunked_canonical_decode_attention(q, cache.k, cache.v, cache.tables[torch.tensor(seqs)], lens,
                                                block_size=cache.block_size, scale=cache.scale,
                                                max_context_len=cache.max_context, key_block=16, key_chunk=64)
    packed = cache.run(_chunked(32), list(zip(seqs, positions)), key_block=16)
    assert not torch.equal(decode.view(torch.int16), packed.view(torch.int16))


def test_key_chunk_is_checked():
    cache = chunk_cache(SHAPES[0], seed=45)
    with pytest.raises(ValueError, match="key_chunk"):
        cache.run(_chunked(24), [(0, 5)], key_block=16)


@settings(max_examples=3)
@given(seed=st.integers(0, 10_000), window=st.sampled_from([None, 9]))
def test_tile_table_gives_the_fixed_tilings_bits(seed, window):
    """A canonical pass's tile table (each sequence's rows in tiles of their own) changes which program takes
    a row, never its bits; at least one launch's fixed tiling put two runs in one tile (the case it changes)."""
    cache = small_cache((6, 2, 16, 8, window), torch.bfloat16, seed=seed, max_context=60)
    assert check_tile_table_keeps_the_bits(cache, random.Random(seed), num_launches=3, max_window=12,
                                           key_block=16, sliding_window=window) >= 1


def test_tile_table_check_can_fail():
    """The bit comparison sees another canonical config's bits (key blocks of 32, not 16) as different."""
    cache = small_cache((6, 2, 16, 8, None), torch.bfloat16, seed=2, max_context=60)
    rows = [(0, p) for p in range(20, 40)]
    a = cache.run(tiled_canonical_attention, rows, static=True, key_block=16)
    b = cache.run(tiled_canonical_attention, rows, static=True, key_block=32)
    assert a.view(torch.uint8).ne(b.view(torch.uint8)).any()


def test_tile_table_is_checked():
    cache = small_cache(SHAPES[0], torch.float32, seed=1)
    with pytest.raises(ValueError, match="tiles must be"):
        cache.run(tiled_canonical_attention, [(0, 3)], tiles=torch.zeros(1, dtype=torch.int64))


# -- the 128-row canonical tile (FixedShapePolicy(tile_m=128): its own canonical config) -----------------------------

@settings(max_examples=2)
@given(seed=st.integers(0, 10_000), window=st.sampled_from([None, 9]))
def test_tile128_row_bits_do_not_depend_on_the_launch(seed, window):
    cache = small_cache((4, 2, 16, 8, window), torch.bfloat16, seed=seed, max_context=80)
    compared = check_canonical_rows_are_their_own(cache, random.Random(seed), num_probes=3, num_launches=2,
                                                  max_neighbours=20, key_block=16, sliding_window=window,
                                                  tile_m=128)
    assert compared >= 2


def test_tile128_kv_tile_table_and_decode_launch():
    cache = small_cache((4, 2, 16, 8, None), torch.bfloat16, seed=23, num_seqs=2, max_context=40)
    check_kv_independent_of_chunking(cache, [[40], [5, 13, 22]], key_block=16, tile_m=128)
    cache = small_cache((6, 2, 16, 8, None), torch.bfloat16, seed=24, max_context=100)
    assert check_tile_table_keeps_the_bits(cache, random.Random(4), num_launches=3, max_window=40,
                                           key_block=16, tile_m=128) >= 1
    check_decode_launch_has_canonical_bits(cache, random.Random(5), num_rows=4, key_block=16, tile_m=128)


def test_tile_m_is_checked():
    """A tile height outside CANONICAL_TILE_HEIGHTS is refused, naming the field, by the kernels and policies."""
    from llm42.policies import BatchInvariantPolicy, FastPolicy, FixedShapePolicy

    cache = small_cache(SHAPES[0], torch.float32, seed=1)
    with pytest.raises(ValueError, match="tile_m"):
        cache.run(tiled_canonical_attention, [(0, 3)], tile_m=32)
    for bad in (32, 256, True, "64", 64.0):
        with pytest.raises(ValueError, match="FixedShapePolicy tile_m"):
            FixedShapePolicy(tile_m=bad)
        with pytest.raises(ValueError, match="FastPolicy canonical_tile_m"):
            FastPolicy(decode_kernel="canonical", canonical_tile_m=bad)
        with pytest.raises(ValueError, match="tile_m"):
            BatchInvariantPolicy(tile_m=bad)
    policy = FixedShapePolicy(tile_m=128)
    assert policy.attention_tile_rows(9, 3) == 42 and FixedShapePolicy().attention_tile_rows(9, 3) == 21
    assert "tile_m=128" in repr(policy) and "tile_m" not in repr(FixedShapePolicy())
    assert "canonical_tile_m=128" in repr(FastPolicy(decode_kernel="canonical", canonical_tile_m=128))


@settings(max_examples=3)
@given(seed=st.integers(0, 10_000), window=st.sampled_from([None, 9]))
def test_kv_tma_gives_the_gathers_bits(seed, window):
    """K/V through TMA descriptors (pages a multiple of the key block) and gathered key by key: the same bits
    in every row of the canonical and the fast prefill launch, with NaN in every slot no row sees."""
    cache = small_cache((4, 2, 16, 32, window), torch.float32, seed=seed, max_context=96)
    compared = check_kv_tma_keeps_the_bits(cache, random.Random(seed), num_launches=2, limit=70, key_block=16,
                                           sliding_window=window, prefill_config=(16, 16, 4, 2))
    assert compared >= 4


def test_kv_tma_check_can_fail():
    """The negative control: another key block is another canonical config, and the check sees its bits."""
    cache = small_cache((4, 2, 16, 32, None), torch.float32, seed=3, max_context=96)
    rows = mixed_rows(cache, random.Random(3), num_chunks=3, num_decode=2)
    outs = [cache.run(tiled_canonical_attention, rows, key_block=kb, kv_tma=True) for kb in (16, 32)]
    assert any(_bits(a) != _bits(b) for a, b in zip(outs[0], outs[1]))


def test_kv_tma_needs_pages_of_whole_key_blocks():
    cache = small_cache(SHAPES[0], torch.float32, seed=2)  # pages of 8
    with pytest.raises(ValueError, match="kv_tma: .*block_size must be a multiple"):
        cache.run(tiled_canonical_attention, [(0, 3)], key_block=16, kv_tma=True)
    odd = small_cache((6, 2, 24, 32, None), torch.float32, seed=2)  # head dim 24
    with pytest.raises(ValueError, match="kv_tma: .*head_dim 24"):
        odd.run(prefill_kernel((16, 16, 4, 2)), [(0, 3)], kv_tma=True)
    assert kv_tma_fits(cache.k, block_size=32, block_n=16) is None


@pytest.mark.parametrize("block_size,kv_tma", [(8, False), (32, True)])
def test_prefill_with_page_prefetch_matches_float64(block_size, kv_tma):
    """An 8-warp launch loads the next key block's page ids while a block runs (gathers and TMA boxes)."""
    cache = small_cache((4, 2, 16, block_size, None), torch.float32, seed=11, max_context=96)
    rows = mixed_rows(cache, random.Random(11), num_chunks=3, num_decode=3)
    check_matches_float64(cache, prefill_kernel((16, 16, 8, 2)), rows, kv_tma=kv_tma)


@pytest.mark.parametrize("tile_m", [64, 128])
def test_canonical_launch_gives_the_group_loops_bits(tile_m):
    """The canonical pass's launch (a tile table, one pass per tile, programs looping over tiles, page ids ahead)
    gives every row the bits of the fixed tiling's group loop (the interpreter runs the code paths; the GPU suite
    checks the warps and stages, and that the check sees the fast launch's other bits)."""
    cache = small_cache(SHAPES[0], torch.float32, seed=11, max_context=64)
    compared, _ = check_launch_keeps_the_bits(cache, random.Random(11), num_launches=2, key_block=16,
                                              sliding_window=SHAPES[0][4], tile_m=tile_m)
    assert compared >= 8


@pytest.mark.parametrize("canonical", [True, False], ids=["canonical", "fast"])
def test_one_group_and_prefetch_launches_give_the_group_loops_bits(canonical):
    """``_launch(one_group=True)`` (the fixed tiling promised one sequence per tile: one pass, no group loop) and
    ``prefetch=True`` on 4 warps give a single sequence's prompt chunk the group loop's bits, in both launches; a
    launch over two sequences' rows is what the promise excludes, and there the two differ (the check can fail)."""
    from llm42.kernels import tiled_attention as ta

    cache = small_cache(SHAPES[0], torch.float32, seed=5, max_context=64)
    rows = [(1, p) for p in range(9, 50)]
    q, positions, row_seq, tables = cache.layout(rows, static=False)
    common = dict(block_size=cache.block_size, scale=cache.scale, sliding_window=SHAPES[0][4], block_m=16,
                  block_n=16, num_warps=4, num_stages=2, is_canonical=canonical)
    args = (q, cache.k, cache.v, positions, row_seq, tables)
    loop = ta._launch(*args, **common)
    for extra in ({"one_group": True}, {"prefetch": True}, {"one_group": True, "prefetch": True}):
        assert _bits(ta._launch(*args, **common, **extra)) == _bits(loop), extra
    mixed = [(0, p) for p in range(20, 24)] + [(2, p) for p in range(30, 34)]  # 8 rows of 2 sequences, one tile
    q2, positions2, row_seq2, tables2 = cache.layout(mixed, static=False)
    args2 = (q2, cache.k, cache.v, positions2, row_seq2, tables2)
    assert _bits(ta._launch(*args2, **common, one_group=True)) != _bits(ta._launch(*args2, **common))
