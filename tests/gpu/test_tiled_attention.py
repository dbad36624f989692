"""The tiled attention kernels on CUDA at model shapes: accuracy against float64, the canonical kernel's
row independence (alone, in other tiles, next to longer and shorter rows, in the canonical pass), and
canonical K/V that does not depend on how a prompt is chunked. The checks are shared with the CPU suite
(``tests/tiled_attention_checks.py``), which runs them through Triton's interpreter at small shapes.
"""

from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("triton")

from llm42 import KVStore, SamplingParams  # noqa: E402
from llm42.kernels import canonical_attention, tiled_canonical_attention, tiled_prefill_attention  # noqa: E402
from llm42.kernels.tiled_attention import PREFILL_LARGE, PREFILL_SMALL  # noqa: E402
from llm42.model.config import llama31_8b_config  # noqa: E402
from llm42.model.forward import forward  # noqa: E402
from llm42.model.weights import random_weights  # noqa: E402
from llm42.policies import FastPolicy, FixedShapePolicy  # noqa: E402
from llm42.runner import ModelRunner, Segment  # noqa: E402
from tests.tiled_attention_checks import (  # noqa: E402
    Cache, check_canonical_rows_are_their_own, check_decode_launch_has_canonical_bits,
    check_chunked_decode_has_canonical_bits, check_decode_order_keeps_the_bits,
    check_deterministic_rows_take_canonical_bits,
    check_kv_independent_of_chunking, check_kv_tma_keeps_the_bits, check_launch_keeps_the_bits,
    check_matches_float64,
    check_tile_table_keeps_the_bits, check_unmasked_full_blocks_keep_the_bits, mixed_rows, prefill_kernel,
)

pytestmark = pytest.mark.gpu
DEVICE = "cuda"
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
SHAPES = [
    # (num_heads, num_kv_heads, head_dim, block_size, max_context, sliding_window)
    (32, 8, 128, 16, 1500, None),  # Llama-3.1-8B
    (16, 2, 128, 16, 700, 100),  # GQA 8:1, a window
    (12, 4, 96, 32, 500, None),  # 3:1, head dim 96
    (8, 8, 64, 16, 400, None),  # 1:1
]


def cache_for(shape, dtype, seed, num_seqs=4):
    num_heads, num_kv_heads, head_dim, block_size, max_context, _ = shape
    return Cache(num_seqs=num_seqs, max_context=max_context, num_heads=num_heads, num_kv_heads=num_kv_heads,
                 head_dim=head_dim, block_size=block_size, dtype=dtype, device=DEVICE, seed=seed)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(str(v) for v in s))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("config", [None, PREFILL_SMALL, PREFILL_LARGE, (32, 32, 4, 2)], ids=str)
def test_tiled_prefill_matches_float64(config, dtype, shape):
    cache = cache_for(shape, dtype, seed=sum(v or 0 for v in shape))
    rows = mixed_rows(cache, random.Random(1), num_chunks=3, num_decode=5, max_chunk=160)
    kernel = tiled_prefill_attention if config is None else prefill_kernel(config)
    check_matches_float64(cache, kernel, rows, sliding_window=shape[5])


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(str(v) for v in s))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("key_block", [16, 64])
def test_tiled_canonical_matches_float64(key_block, dtype, shape):
    cache = cache_for(shape, dtype, seed=sum(v or 0 for v in shape) + key_block)
    rows = mixed_rows(cache, random.Random(2), num_chunks=3, num_decode=5, max_chunk=160)
    check_matches_float64(cache, tiled_canonical_attention, rows, sliding_window=shape[5], key_block=key_block)


@pytest.mark.parametrize("tile_m", [64, 128])
@pytest.mark.parametrize("mask_every_block", [True, False], ids=["masked", "unmasked_full"])
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_canonical_row_bits_do_not_depend_on_the_launch(dtype, seed, mask_every_block, tile_m):
    """At each tile height (``FixedShapePolicy(tile_m=)``; 128-row tiles get twice the neighbours to mix)."""
    shape = SHAPES[seed % 2]
    cache = cache_for(shape, dtype, seed=(100 if tile_m == 64 else 300) + seed)
    compared = check_canonical_rows_are_their_own(cache, random.Random(seed), num_probes=6, num_launches=6,
                                                  max_neighbours=60 * tile_m // 64, key_block=64,
                                                  sliding_window=shape[5], mask_every_block=mask_every_block,
                                                  tile_m=tile_m)
    assert compared >= 30


@pytest.mark.parametrize("block_size", [64, 128])
@pytest.mark.parametrize("tile_m", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", SHAPES[:2], ids=lambda s: "x".join(str(v) for v in s))
def test_kv_tma_gives_the_gathers_bits(shape, dtype, tile_m, block_size):
    """K/V through TMA descriptors (pages of whole 64-key blocks) and gathered key by key: every row the same
    bits in the canonical launch at both tile heights and in the fast prefill launch, NaN in every slot no row
    sees. What lets a page size of 64 or 128 take the descriptors without changing a committed bit."""
    shape = shape[:3] + (block_size,) + shape[4:]
    cache = cache_for(shape, dtype, seed=400 + block_size + tile_m)
    config = (128, block_size, 8, 3)  # 8 warps: the page ids prefetched too; key blocks of a page
    compared = check_kv_tma_keeps_the_bits(cache, random.Random(tile_m), num_launches=3, limit=shape[4] - 150,
                                           key_block=64, sliding_window=shape[5], tile_m=tile_m,
                                           prefill_config=config)
    assert compared >= 100


UNMASKED_CASES = [(shape, dtype, 64) for shape in SHAPES for dtype in DTYPES] + [
    (SHAPES[0], torch.bfloat16, 16), (SHAPES[1], torch.float16, 16)]


@pytest.mark.parametrize("shape,dtype,key_block", UNMASKED_CASES,
                         ids=lambda v: "x".join(str(x) for x in v) if isinstance(v, tuple) else str(v))
def test_unmasked_full_blocks_keep_the_canonical_bits(shape, dtype, key_block):
    """Skipping the masks on key blocks every row of a tile's group sees in full changes no row's bits
    (what lets CANONICAL_MASK_EVERY_BLOCK change without changing a committed bit)."""
    cache = cache_for(shape, dtype, seed=200 + key_block)
    compared = check_unmasked_full_blocks_keep_the_bits(cache, random.Random(key_block), num_launches=4,
                                                        key_block=key_block, sliding_window=shape[5])
    assert compared >= 100  # rows that ran an unmasked block (480 to 2,400 in these launches)


def test_unmasked_full_blocks_check_can_fail():
    """Negative control: the same check against another key block (other canonical bits) fails."""
    cache = cache_for(SHAPES[0], torch.bfloat16, seed=210)
    with pytest.raises(AssertionError):
        check_unmasked_full_blocks_keep_the_bits(cache, random.Random(1), num_launches=2, key_block=64,
                                                 other=dict(key_block=32))


def test_canonical_row_bits_at_1_7_64_256_rows_and_any_index(report, dtype=torch.bfloat16):
    """The existing row kernel's invariance test, for the tiled kernel: a probe at rows 1..256, any index."""
    cache = cache_for(SHAPES[0], dtype, seed=7, num_seqs=6)
    rng = random.Random(7)
    probe = (2, 911)
    outputs = set()
    for num_rows in (1, 7, 64, 256):
        for index in sorted({0, num_rows // 2, num_rows - 1}):
            rows = [(rng.randrange(6), rng.randrange(1200)) for _ in range(num_rows)]
            rows[index] = probe
            rows = list(dict.fromkeys(rows))
            out = cache.run(tiled_canonical_attention, rows, static=bool(index % 2))
            outputs.add(out[rows.index(probe)].cpu().view(torch.int16).numpy().tobytes())
    assert len(outputs) == 1


@pytest.mark.parametrize("mask_every_block", [True, False], ids=["masked", "unmasked_full"])
@pytest.mark.parametrize("window", [None, 100])
def test_canonical_kv_does_not_depend_on_chunking(window, mask_every_block):
    shape = SHAPES[0]
    cache = cache_for(shape, torch.bfloat16, seed=11, num_seqs=2)
    check_kv_independent_of_chunking(cache, [[1024], [256] * 4, [100, 1, 400, 523], [31, 993]], key_block=64,
                                     sliding_window=window, mask_every_block=mask_every_block)


def test_tiled_canonical_is_not_the_row_kernel_but_agrees_within_rounding(report):
    """The tiled kernel's bits are a new canonical config (docs/gpu.md): close to the row kernel's."""
    cache = cache_for(SHAPES[0], torch.bfloat16, seed=3)
    rows = mixed_rows(cache, random.Random(3), num_chunks=3, num_decode=8, max_chunk=160)
    tiled = cache.run(tiled_canonical_attention, rows)
    old = cache.run(canonical_attention, rows)
    report("tiled_vs_row_kernel_equal_fraction", float((tiled == old).float().mean()))
    torch.testing.assert_close(tiled.float(), old.float(), atol=2e-2, rtol=2e-2)


# -- through the policies and the canonical pass -------------------------------------------------------------

@pytest.fixture(scope="module")
def small_model():
    cfg = llama31_8b_config(max_position_embeddings=2048, num_layers=2)
    return cfg, random_weights(cfg, seed=0, dtype=torch.bfloat16, device=DEVICE, lm_head_std=0.2)


def _canonical_logits_and_kv(cfg, weights, layout, needle, num_rows, policy):
    runner = ModelRunner(weights, cfg)
    kv = KVStore(cfg, num_blocks=256, block_size=16, num_scratch_slots=num_rows, device=DEVICE,
                 dtype=torch.bfloat16)
    segments = []
    for rid, prompt in enumerate(layout):
        kv.allocate(rid, len(prompt) + 1)
        kv.append(rid, len(prompt))
        segments.append(Segment(rid, tuple(prompt), 0, SamplingParams(), 0))
    inputs = runner.canonical_inputs(segments, kv, num_rows)
    logits = forward(weights, cfg, inputs, kv.layers(), policy)
    start = sum(len(p) for p in layout[:needle])
    slots = torch.tensor(kv.slots(needle, 0, len(layout[needle])), device=DEVICE)
    return logits[start:start + len(layout[needle])], kv.layers().k[1][slots].clone()


@pytest.mark.parametrize("tile_m", [64, 128])
def test_canonical_pass_row_bits_do_not_depend_on_the_pass(small_model, tile_m):
    """FixedShapePolicy on CUDA (the tiled kernel, at each tile height): a prompt's logits and K/V alone and
    among others."""
    cfg, weights = small_model
    rng = random.Random(0)
    needle = [rng.randrange(cfg.vocab_size) for _ in range(37)]
    policy = FixedShapePolicy(tile_m=tile_m)
    alone = _canonical_logits_and_kv(cfg, weights, [needle], 0, 256, policy)
    for before in ([5], [40, 3], [100, 17, 1]):
        others = [[rng.randrange(cfg.vocab_size) for _ in range(n)] for n in before]
        mixed = _canonical_logits_and_kv(cfg, weights, others + [needle, [7] * 9], len(others), 256, policy)
        assert torch.equal(alone[0], mixed[0]) and torch.equal(alone[1], mixed[1])


def test_fast_policy_prefill_matches_the_canonical_pass_within_rounding(small_model):
    cfg, weights = small_model
    rng = random.Random(1)
    layout = [[rng.randrange(cfg.vocab_size) for _ in range(n)] for n in (300, 45, 1)]
    fast = _canonical_logits_and_kv(cfg, weights, layout, 0, 512, FastPolicy(attention_backend="triton"))
    canonical = _canonical_logits_and_kv(cfg, weights, layout, 0, 512, FixedShapePolicy())
    f, c = fast[0].float(), canonical[0].float()
    # bf16 drift of two layers over 346 x 128K logits: on the H200, 48 of 38.5M elements were beyond
    # 0.3 + 0.05 |x| (largest difference 0.45) and every other one within it. A wrong kernel is off everywhere.
    outside = (f - c).abs() > 0.3 + 0.05 * c.abs()
    assert float(outside.float().mean()) < 1e-5 and float((f - c).abs().max()) < 1.0
    assert float((f.argmax(-1) == c.argmax(-1)).float().mean()) > 0.97


@pytest.mark.parametrize("shape", [SHAPES[0], SHAPES[1], (9, 3, 64, 16, 1200, None)],
                         ids=lambda s: "x".join(str(v) for v in s))
def test_decode_launch_gives_decode_rows_the_canonical_bits(shape):
    """FastPolicy(decode_kernel="canonical")'s kernel on the H200: each decode row the canonical pass's bits."""
    cache = cache_for(shape, torch.bfloat16, seed=21, num_seqs=48)
    check_decode_launch_has_canonical_bits(cache, random.Random(5), num_rows=48, key_block=64,
                                           sliding_window=shape[5])


@pytest.mark.parametrize("shape", [SHAPES[0], SHAPES[1], (9, 3, 64, 16, 1200, None)],
                         ids=lambda s: "x".join(str(v) for v in s))
@pytest.mark.parametrize("num_splits", [1, 4])
def test_deterministic_rows_take_the_canonical_bits(shape, num_splits):
    """FastPolicy(decode_kernel="deterministic")'s pair of launches at model shapes: flagged rows the canonical
    decode launch's bits, the others the split kernel's, neither launch touching the other's rows."""
    cache = cache_for(shape, torch.bfloat16, seed=22, num_seqs=48)
    assert check_deterministic_rows_take_canonical_bits(cache, random.Random(num_splits), key_block=64,
                                                        num_splits=num_splits, sliding_window=shape[5]) >= 1


@pytest.mark.parametrize("shape", [SHAPES[0], SHAPES[1], (9, 3, 64, 16, 1200, None)],
                         ids=lambda s: "x".join(str(v) for v in s))
@pytest.mark.parametrize("num_splits", [1, 4])
def test_decode_program_order_keeps_the_bits(shape, num_splits):
    """The split decode kernel's grid and dispatch order (longest context first) on the GPU, at model shapes
    (the first the 8B's heads): the same bits in every order, the order read."""
    cache = cache_for(shape, torch.bfloat16, seed=23, num_seqs=64)
    check_decode_order_keeps_the_bits(cache, random.Random(num_splits), num_splits=num_splits,
                                      sliding_window=shape[5])


@pytest.mark.parametrize("shape", [SHAPES[0], SHAPES[1], (9, 3, 64, 16, 1200, None)],
                         ids=lambda s: "x".join(str(v) for v in s))
@pytest.mark.parametrize("key_chunk", [128, 512])
def test_chunked_decode_gives_decode_rows_the_canonical_bits(shape, key_chunk):
    """The chunked kernel on the H200: a decode row's chunks in parallel programs, folded, give it the packed
    canonical launch's bits and a verify window's."""
    cache = cache_for(shape, torch.bfloat16, seed=24, num_seqs=32)
    assert check_chunked_decode_has_canonical_bits(cache, random.Random(key_chunk), key_block=64,
                                                   key_chunk=key_chunk, sliding_window=shape[5]) >= 1


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_chunked_canonical_rows_are_their_own(dtype):
    import functools

    from llm42.kernels import chunked_canonical_attention

    cache = cache_for(SHAPES[0], dtype, seed=25, num_seqs=6)
    kernel = functools.partial(chunked_canonical_attention, key_chunk=256)
    assert check_canonical_rows_are_their_own(cache, random.Random(3), num_probes=6, num_launches=3,
                                              max_neighbours=40, key_block=64, kernel=kernel) >= 15


def test_chunked_canonical_matches_float64():
    import functools

    from llm42.kernels import chunked_canonical_attention

    cache = cache_for(SHAPES[0], torch.bfloat16, seed=26)
    rows = mixed_rows(cache, random.Random(4), num_chunks=3, num_decode=8)
    check_matches_float64(cache, functools.partial(chunked_canonical_attention, key_chunk=256), rows, key_block=64)


def test_fast_policy_routes_deterministic_rows(small_model):
    """The policy itself: a decode step's rows flagged deterministic get the canonical decode launch's bits,
    the others the split kernel's at the split count the step would choose."""
    from llm42 import kernels
    from llm42.inputs import StepInputs

    cache = cache_for((9, 3, 64, 16, 1200, None), torch.bfloat16, seed=23, num_seqs=40)
    rng = random.Random(6)
    positions = [rng.randrange(cache.max_context) for _ in range(cache.num_seqs)]
    q, _, _, _ = cache.layout(list(enumerate(positions)), static=False)
    lens = torch.tensor([p + 1 for p in positions], device=DEVICE)
    flags = torch.tensor([rng.random() < 0.4 for _ in positions], dtype=torch.int8, device=DEVICE)
    n = cache.num_seqs
    inputs = StepInputs(token_ids=torch.zeros(n, dtype=torch.int64, device=DEVICE), positions=lens - 1,
                        slot_mapping=torch.zeros(n, dtype=torch.int64, device=DEVICE),
                        row_seq=torch.arange(n, device=DEVICE), block_tables=cache.tables, context_lens=lens,
                        seq_starts=tuple(range(n + 1)), max_context_len=cache.max_context, deterministic_rows=flags)
    common = dict(block_size=cache.block_size, scale=cache.scale, sliding_window=None)
    got = FastPolicy(decode_kernel="deterministic", canonical_key_block=64).attention(q, cache.k, cache.v, inputs,
                                                                                       **common)
    chunked = FastPolicy(decode_kernel="deterministic", canonical_key_chunk=256).attention(q, cache.k, cache.v,
                                                                                           inputs, **common)
    split = kernels.paged_decode_attention(q, cache.k, cache.v, cache.tables, lens, max_context_len=cache.max_context,
                                           **common)
    canonical = kernels.tiled_canonical_decode_attention(q, cache.k, cache.v, cache.tables, lens, key_block=64,
                                                         **common)
    is_det = flags.bool()
    assert 0 < int(is_det.sum()) < n
    assert torch.equal(got[is_det].view(torch.int16), canonical[is_det].view(torch.int16))
    assert torch.equal(got[~is_det].view(torch.int16), split[~is_det].view(torch.int16))
    by_chunks = kernels.chunked_canonical_decode_attention(q, cache.k, cache.v, cache.tables, lens,
                                                           max_context_len=cache.max_context, key_chunk=256, **common)
    assert torch.equal(chunked[is_det].view(torch.int16), by_chunks[is_det].view(torch.int16))
    assert torch.equal(chunked[~is_det].view(torch.int16), split[~is_det].view(torch.int16))


def test_fast_policy_canonical_decode_kernel_keeps_the_contract(small_model):
    """Deterministic output does not depend on the fast path's decode kernel; a large batch reaches it."""
    from llm42 import DVRGenerator

    cfg, weights = small_model
    rng = random.Random(2)
    prompts = [[rng.randrange(cfg.vocab_size) for _ in range(rng.randint(5, 60))] for _ in range(96)]
    params = [SamplingParams(max_new_tokens=24, ignore_eos=True, deterministic=(i % 8 == 0), temperature=0.0)
              for i in range(len(prompts))]
    outputs = {}
    for kernel in ("split", "canonical", "deterministic"):
        gen = DVRGenerator(weights, cfg, fast_policy=FastPolicy(decode_kernel=kernel), max_num_seqs=96)
        outputs[kernel] = [o.token_ids for o in gen.generate(prompts, params)]
        gen.close()
    for kernel in ("split", "deterministic"):  # the chunked canonical kernel, deterministic rows on its bits
        gen = DVRGenerator(weights, cfg, fast_policy=FastPolicy(decode_kernel=kernel, canonical_key_chunk=256),
                           canonical_policy=FixedShapePolicy(attention_kernel="chunked", key_chunk=256),
                           max_num_seqs=96)
        outputs[f"chunked_{kernel}"] = [o.token_ids for o in gen.generate(prompts, params)]
        gen.close()
    det = [i for i, p in enumerate(params) if p.deterministic]
    assert [outputs["chunked_split"][i] for i in det] == [outputs["chunked_deterministic"][i] for i in det]
    assert [outputs["split"][i] for i in det] == [outputs["canonical"][i] for i in det]
    assert [outputs["split"][i] for i in det] == [outputs["deterministic"][i] for i in det]


@pytest.mark.parametrize("shape", [(9, 3, 64, 16, 900, None), (32, 8, 128, 16, 1500, None), (16, 2, 128, 16, 700, 100)],
                         ids=["smollm2", "llama8b", "gqa8_window"])
def test_tile_table_gives_the_fixed_tilings_bits(shape, report):
    """The canonical launch with a pass's tile table (each run of one sequence's rows in tiles of its own: the
    staged ``StepInputs.tiles``) gives every row the fixed tiling's bits at model shapes (SmolLM2's 9 / 3 heads:
    21-row tiles), and follows the table (a table of one tile leaves every other row as it was)."""
    cache = cache_for(shape, torch.bfloat16, seed=31, num_seqs=6)
    spanning = check_tile_table_keeps_the_bits(cache, random.Random(5), num_launches=6, max_window=40,
                                               key_block=64, sliding_window=shape[5])
    report(f"tile_table_launches_spanning_{shape[0]}x{shape[1]}", spanning)
    assert spanning >= 1


# -- the 128-row canonical tile (FixedShapePolicy(tile_m=128): its own canonical config) -----------------------------

@pytest.mark.parametrize("window", [None, 100])
def test_tile128_kv_does_not_depend_on_chunking(window):
    cache = cache_for(SHAPES[0], torch.bfloat16, seed=311, num_seqs=2)
    check_kv_independent_of_chunking(cache, [[1024], [256] * 4, [100, 1, 400, 523], [31, 993]], key_block=64,
                                     sliding_window=window, tile_m=128)


@pytest.mark.parametrize("shape", [(9, 3, 64, 16, 900, None), (32, 8, 128, 16, 1500, None), (16, 2, 128, 16, 700, 100)],
                         ids=["smollm2", "llama8b", "gqa8_window"])
def test_tile128_tile_table_and_decode_launch(shape, report):
    """At 128-row tiles: a pass's tile table gives the fixed tiling's bits, and the one-row decode launch (the
    fast path's ``FastPolicy(canonical_tile_m=128)``) gives decode rows the packed launch's bits."""
    cache = cache_for(shape, torch.bfloat16, seed=312, num_seqs=48)
    spanning = check_tile_table_keeps_the_bits(cache, random.Random(6), num_launches=6, max_window=80,
                                               key_block=64, sliding_window=shape[5], tile_m=128)
    report(f"tile128_table_launches_spanning_{shape[0]}x{shape[1]}", spanning)
    assert spanning >= 1
    check_decode_launch_has_canonical_bits(cache, random.Random(7), num_rows=48, key_block=64,
                                           sliding_window=shape[5], tile_m=128)


@pytest.mark.parametrize("tile_m", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", SHAPES[:3], ids=lambda s: "x".join(str(v) for v in s))
def test_canonical_launch_keeps_round_19s_bits(shape, dtype, tile_m):
    """``CANONICAL_LAUNCH`` (round 20: 4 warps / 3 stages at 64 rows, 8 / 3 at 128, page ids ahead, one pass per
    tile of a tile table) against round 19's launch (4 warps, 2 stages, the group loop): every row the same bits;
    the fast launch's FMA contraction gives some row other bits (the check can fail)."""
    cache = cache_for(shape, dtype, seed=21)
    compared, differ = check_launch_keeps_the_bits(cache, random.Random(21), num_launches=3, key_block=64,
                                                   sliding_window=shape[5], tile_m=tile_m)
    assert compared >= 30 and differ > 0
