"""The optional flash-attn attention backend (``llm42.ops.flash``) and the policies' dispatch to it.

flash-attn is not installable on this project's machines, so the CPU tests put a
fake ``flash_attn`` module into ``sys.modules``: its ``flash_attn_with_kvcache``
is a float64 torch reference of the documented flash-attn 2.x semantics (paged
``block_table``, ``cache_seqlens``, bottom-right causal alignment,
``window_size``, ``softmax_scale``) that also checks the documented argument
constraints and records every call. The real kernel is exercised only by the
``gpu`` test at the end, which skips unless ``flash_attn`` imports.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

from llm42.inputs import StepInputs
from llm42.kv_store import KVStore
from llm42.model.forward import forward
from llm42.model.weights import random_weights
from llm42.ops import flash
from llm42.ops.attention import blocked_attention, padded_attention
from llm42.params import SamplingParams
from llm42.policies import FastPolicy, FixedShapePolicy, NoisyFastPolicy
from llm42.runner import ModelRunner, Segment
from tests.helpers import decode_inputs, tiny_config

PAGE = 256
TOLERANCE = {torch.bfloat16: dict(rtol=2e-2, atol=2e-2), torch.float16: dict(rtol=3e-3, atol=3e-3)}


# -- the fake flash_attn module ------------------------------------------------------------------------

def _reference_flash_attn_with_kvcache(calls, q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
                                       rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                                       cache_leftpad=None, block_table=None, softmax_scale=None, causal=False,
                                       window_size=(-1, -1), softcap=0.0, rotary_interleaved=True,
                                       alibi_slopes=None, num_splits=0, return_softmax_lse=False):
    """flash_attn_with_kvcache (flash-attn 2.x) as documented, in float64, for the paged-cache case only."""
    assert k is None and v is None and rotary_cos is None and rotary_sin is None  # no in-kernel cache append
    assert cache_batch_idx is None and cache_leftpad is None and alibi_slopes is None and softcap == 0.0
    assert not return_softmax_lse
    assert q.dtype in (torch.float16, torch.bfloat16), "FlashAttention only support fp16 and bf16 data type"
    assert k_cache.dtype == q.dtype and v_cache.dtype == q.dtype
    assert q.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    batch, seqlen_q, num_heads, head_dim = q.shape
    num_blocks, page, num_kv_heads, _ = k_cache.shape
    assert k_cache.shape == v_cache.shape == (num_blocks, page, num_kv_heads, head_dim)
    assert page % 256 == 0, "Paged KV cache block size must be divisible by 256"
    assert head_dim <= 256 and num_heads % num_kv_heads == 0
    assert block_table.dtype == torch.int32 and block_table.stride(-1) == 1 and block_table.shape[0] == batch
    assert cache_seqlens.dtype == torch.int32 and cache_seqlens.is_contiguous() and cache_seqlens.shape == (batch,)
    assert isinstance(num_splits, int) and num_splits >= 0
    calls.append(dict(batch=batch, seqlen_q=seqlen_q, num_splits=num_splits, causal=causal,
                      window_size=tuple(window_size), softmax_scale=softmax_scale,
                      table_shape=tuple(block_table.shape)))
    scale = head_dim ** -0.5 if softmax_scale is None else softmax_scale
    left, right = window_size
    if causal:
        right = 0
    groups = num_heads // num_kv_heads
    out = torch.zeros(batch, seqlen_q, num_heads, head_dim, dtype=torch.float64)
    for b in range(batch):
        seqlen_k = int(cache_seqlens[b])
        key_pos = torch.arange(seqlen_k)
        blocks = block_table[b, key_pos // page].long()
        keys = k_cache[blocks, key_pos % page].double().repeat_interleave(groups, dim=1)  # [K, Hq, D]
        vals = v_cache[blocks, key_pos % page].double().repeat_interleave(groups, dim=1)
        for i in range(seqlen_q):
            # query i sees keys [i + seqlen_k - seqlen_q - left, i + seqlen_k - seqlen_q + right]
            centre = i + seqlen_k - seqlen_q
            visible = torch.ones(seqlen_k, dtype=torch.bool)
            if left >= 0:
                visible &= key_pos >= centre - left
            if right >= 0:
                visible &= key_pos <= centre + right
            if not visible.any():
                continue  # "If the row of the mask is all zero, the output will be zero."
            s = torch.einsum("hd,khd->hk", q[b, i].double(), keys) * scale
            s = s.masked_fill(~visible, float("-inf"))
            out[b, i] = torch.einsum("hk,khd->hd", torch.softmax(s, dim=-1), vals)
    return out.to(q.dtype)


@pytest.fixture
def fake_flash(monkeypatch):
    """Install the fake ``flash_attn``; yields its list of recorded calls."""
    calls = []
    module = types.ModuleType("flash_attn")
    module.flash_attn_with_kvcache = lambda *args, **kwargs: _reference_flash_attn_with_kvcache(calls, *args,
                                                                                                **kwargs)
    monkeypatch.setitem(sys.modules, "flash_attn", module)
    flash.clear_cache()
    yield calls
    monkeypatch.delitem(sys.modules, "flash_attn")
    flash.clear_cache()


@pytest.fixture
def no_flash(monkeypatch):
    """Make sure ``flash_attn`` does not import (None in sys.modules makes ``import`` raise)."""
    monkeypatch.setitem(sys.modules, "flash_attn", None)
    flash.clear_cache()
    yield
    flash.clear_cache()


@pytest.fixture
def pretend_cuda(monkeypatch):
    """The dispatch as it would run on CUDA: ``unsupported`` without its device check (all else kept)."""
    real = flash.unsupported
    monkeypatch.setattr(flash, "unsupported",
                        lambda *args, **kwargs: tuple(r for r in real(*args, **kwargs) if "CUDA" not in r))


# -- random paged layouts --------------------------------------------------------------------------------

def paged_cache(generator, *, num_blocks, block_size, num_kv_heads, head_dim, dtype):
    shape = (num_blocks * block_size, num_kv_heads, head_dim)
    k = torch.randn(shape, generator=generator).to(dtype)
    v = torch.randn(shape, generator=generator).to(dtype)
    return k, v


def decode_step(generator, *, num_seqs, num_blocks, block_size, max_context):
    """One query row per sequence at its last position; shuffled tables padded with block 0."""
    max_blocks = -(-max_context // block_size)
    context_lens = torch.randint(1, max_context + 1, (num_seqs,), generator=generator)
    perm = torch.randperm(num_blocks, generator=generator)
    assert num_blocks >= num_seqs * max_blocks
    tables = perm[: num_seqs * max_blocks].view(num_seqs, max_blocks).clone()
    for s in range(num_seqs):  # unused table entries point at an arbitrary block, as the scratch block does
        tables[s, -(-int(context_lens[s]) // block_size):] = 0
    return decode_inputs(tables, context_lens)


def canonical_step(generator, *, num_rows, num_blocks, block_size, max_context, scratch_block):
    """Like ``ModelRunner.canonical_inputs``: windows of consecutive rows of a few sequences, then dummy rows
    (position 0, the scratch table); every row its own block-table row."""
    max_blocks = -(-max_context // block_size)
    positions, tables = [], []
    while len(positions) < num_rows - 3:
        table = torch.randperm(num_blocks, generator=generator)[:max_blocks].tolist()
        window = int(torch.randint(1, 6, (1,), generator=generator))
        first = int(torch.randint(0, max_context - window + 1, (1,), generator=generator))
        for p in range(first, min(first + window, first + num_rows - 3 - len(positions))):
            positions.append(p)
            tables.append(table)
    while len(positions) < num_rows:
        positions.append(0)
        tables.append([scratch_block] * max_blocks)
    positions = torch.tensor(positions)
    return StepInputs(
        token_ids=torch.zeros(num_rows, dtype=torch.int64),
        positions=positions,
        slot_mapping=torch.zeros(num_rows, dtype=torch.int64),
        row_seq=torch.arange(num_rows),
        block_tables=torch.tensor(tables),
        context_lens=positions + 1,
        seq_starts=tuple(range(num_rows + 1)),
        max_context_len=int(positions.max()) + 1,
    )


SHAPES = [  # (num_heads, num_kv_heads, head_dim, sliding_window)
    (4, 4, 32, None),
    (8, 2, 64, None),  # GQA
    (6, 1, 16, 300),  # MQA, sliding window longer than a page
    (4, 2, 32, 1),  # a window of one key: the row's own
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim,sliding_window", SHAPES)
def test_decode_adapter_matches_padded_attention(fake_flash, dtype, num_heads, num_kv_heads, head_dim,
                                                 sliding_window):
    generator = torch.Generator().manual_seed(num_heads * 100 + head_dim)
    k, v = paged_cache(generator, num_blocks=13, block_size=PAGE, num_kv_heads=num_kv_heads, head_dim=head_dim,
                       dtype=dtype)
    inputs = decode_step(generator, num_seqs=4, num_blocks=13, block_size=PAGE, max_context=3 * PAGE)
    q = torch.randn(4, num_heads, head_dim, generator=generator).to(dtype)
    scale = head_dim ** -0.5
    out = flash.decode_attention(q, k, v, inputs.block_tables, inputs.context_lens, block_size=PAGE, scale=scale,
                                 sliding_window=sliding_window)
    ref = padded_attention(q.float(), k.float(), v.float(), inputs, block_size=PAGE, scale=scale,
                           sliding_window=sliding_window)
    assert out.dtype == dtype and out.shape == q.shape
    torch.testing.assert_close(out.float(), ref, **TOLERANCE[dtype])
    [call] = fake_flash
    assert call["batch"] == 4 and call["seqlen_q"] == 1 and call["num_splits"] == 0 and call["causal"]
    assert call["softmax_scale"] == scale
    assert call["window_size"] == ((-1, -1) if sliding_window is None else (sliding_window - 1, 0))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim,sliding_window", SHAPES)
def test_canonical_adapter_matches_blocked_attention(fake_flash, dtype, num_heads, num_kv_heads, head_dim,
                                                     sliding_window):
    generator = torch.Generator().manual_seed(num_heads * 100 + head_dim + 1)
    num_rows, num_blocks = 24, 40
    k, v = paged_cache(generator, num_blocks=num_blocks + 1, block_size=PAGE, num_kv_heads=num_kv_heads,
                       head_dim=head_dim, dtype=dtype)
    inputs = canonical_step(generator, num_rows=num_rows, num_blocks=num_blocks, block_size=PAGE,
                            max_context=3 * PAGE, scratch_block=num_blocks)
    q = torch.randn(num_rows, num_heads, head_dim, generator=generator).to(dtype)
    scale = head_dim ** -0.5
    out = flash.canonical_attention(q, k, v, inputs.positions, inputs.row_seq, inputs.block_tables,
                                    block_size=PAGE, scale=scale, sliding_window=sliding_window)
    ref = blocked_attention(q.float(), k.float(), v.float(), inputs, block_size=PAGE, scale=scale, key_block=64,
                            sliding_window=sliding_window)
    torch.testing.assert_close(out.float(), ref, **TOLERANCE[dtype])
    [call] = fake_flash
    assert call["batch"] == num_rows and call["seqlen_q"] == 1 and call["num_splits"] == 1
    assert call["table_shape"] == tuple(inputs.block_tables.shape)


def test_canonical_adapter_gathers_tables_by_row_seq(fake_flash):
    """Rows that share a block-table row (varlen layout) get the same answer as with one table row each."""
    generator = torch.Generator().manual_seed(5)
    k, v = paged_cache(generator, num_blocks=8, block_size=PAGE, num_kv_heads=2, head_dim=32, dtype=torch.bfloat16)
    tables = torch.tensor([[3, 5], [6, 1]])
    row_seq = torch.tensor([0, 0, 0, 1, 1])
    positions = torch.tensor([254, 255, 256, 10, 11])
    q = torch.randn(5, 4, 32, generator=generator).to(torch.bfloat16)
    shared = flash.canonical_attention(q, k, v, positions, row_seq, tables, block_size=PAGE, scale=0.2)
    own = flash.canonical_attention(q, k, v, positions, torch.arange(5), tables[row_seq], block_size=PAGE,
                                    scale=0.2)
    assert torch.equal(shared, own)
    assert [c["batch"] for c in fake_flash] == [5, 5]


# -- applicability and the policies' dispatch ------------------------------------------------------------

def _tensors(dtype=torch.bfloat16, head_dim=32, block_size=PAGE):
    q = torch.zeros(3, 4, head_dim, dtype=dtype)
    k = torch.zeros(4 * block_size, 2, head_dim, dtype=dtype)
    return q, k, k.clone()


def test_unsupported_names_every_reason():
    q, k, v = _tensors()
    assert flash.unsupported(q, k, v, block_size=PAGE) == ("the tensors are not on CUDA",)
    assert any("block_size 16" in r for r in flash.unsupported(*_tensors(block_size=16), block_size=16))
    assert any("dtypes" in r for r in flash.unsupported(*_tensors(torch.float32), block_size=PAGE))
    assert any("dtypes" in r for r in flash.unsupported(q, k.half(), v.half(), block_size=PAGE))
    assert any("head_dim 12" in r for r in flash.unsupported(*_tensors(head_dim=12), block_size=PAGE))
    assert any("head_dim 512" in r for r in flash.unsupported(*_tensors(head_dim=512), block_size=PAGE))
    assert any("whole number of blocks" in r for r in flash.unsupported(q, k[:-1], v[:-1], block_size=PAGE))


def _policy_attention(policy, inputs, *, dtype=torch.bfloat16, block_size=PAGE, seed=0):
    generator = torch.Generator().manual_seed(seed)
    num_slots = (int(inputs.block_tables.max()) + 1) * block_size
    k = torch.randn(num_slots, 2, 32, generator=generator).to(dtype)
    v = torch.randn(num_slots, 2, 32, generator=generator).to(dtype)
    q = torch.randn(inputs.num_rows, 4, 32, generator=generator).to(dtype)
    out = policy.attention(q, k, v, inputs, block_size=block_size, scale=0.17, sliding_window=None)
    return out, (q, k, v)


def _prefill_step():
    """Two sequences of 3 and 2 rows: a fast step with prefill rows."""
    positions = torch.tensor([0, 1, 2, 5, 6])
    return StepInputs(
        token_ids=torch.zeros(5, dtype=torch.int64), positions=positions,
        slot_mapping=torch.zeros(5, dtype=torch.int64), row_seq=torch.tensor([0, 0, 0, 1, 1]), block_tables=torch.tensor([[2], [1]]),
        context_lens=torch.tensor([3, 7]), seq_starts=(0, 3, 5), max_context_len=7,
    )


def test_auto_falls_back_on_cpu_tensors(fake_flash):
    """flash_attn imports, but the tensors are on the CPU: "auto" runs exactly the CPU kernels."""
    generator = torch.Generator().manual_seed(1)
    decode = decode_step(generator, num_seqs=3, num_blocks=9, block_size=PAGE, max_context=2 * PAGE)
    canonical = canonical_step(generator, num_rows=8, num_blocks=9, block_size=PAGE, max_context=2 * PAGE,
                               scratch_block=9)
    out, (q, k, v) = _policy_attention(FastPolicy(), decode)
    assert torch.equal(out, padded_attention(q, k, v, decode, block_size=PAGE, scale=0.17))
    out, (q, k, v) = _policy_attention(FixedShapePolicy(), canonical)
    assert torch.equal(out, blocked_attention(q, k, v, canonical, block_size=PAGE, scale=0.17, key_block=64))
    assert fake_flash == []


def test_auto_falls_back_when_flash_attn_does_not_import(no_flash, pretend_cuda):
    generator = torch.Generator().manual_seed(2)
    decode = decode_step(generator, num_seqs=3, num_blocks=9, block_size=PAGE, max_context=2 * PAGE)
    out, (q, k, v) = _policy_attention(FastPolicy(), decode)
    assert torch.equal(out, padded_attention(q, k, v, decode, block_size=PAGE, scale=0.17))


def test_auto_falls_back_on_block_size_16(fake_flash, pretend_cuda):
    generator = torch.Generator().manual_seed(3)
    decode = decode_step(generator, num_seqs=3, num_blocks=40, block_size=16, max_context=100)
    canonical = canonical_step(generator, num_rows=8, num_blocks=40, block_size=16, max_context=100,
                               scratch_block=40)
    _policy_attention(FastPolicy(), decode, block_size=16)
    _policy_attention(FixedShapePolicy(), canonical, block_size=16)
    assert fake_flash == []


def test_auto_falls_back_on_float32(fake_flash, pretend_cuda):
    generator = torch.Generator().manual_seed(4)
    decode = decode_step(generator, num_seqs=3, num_blocks=9, block_size=PAGE, max_context=2 * PAGE)
    _policy_attention(FastPolicy(), decode, dtype=torch.float32)
    assert fake_flash == []


def test_auto_dispatch_on_cuda(fake_flash, pretend_cuda):
    """Where flash-attn can serve a step: fast decode with num_splits=0, the canonical pass with batch R and
    num_splits=1; fast steps with prefill rows take the policy's own kernels."""
    generator = torch.Generator().manual_seed(6)
    decode = decode_step(generator, num_seqs=3, num_blocks=9, block_size=PAGE, max_context=2 * PAGE)
    out, (q, k, v) = _policy_attention(FastPolicy(), decode)
    assert [(c["batch"], c["num_splits"]) for c in fake_flash] == [(3, 0)]
    torch.testing.assert_close(out.float(), padded_attention(q.float(), k.float(), v.float(), decode,
                                                             block_size=PAGE, scale=0.17), **TOLERANCE[q.dtype])

    canonical = canonical_step(generator, num_rows=16, num_blocks=9, block_size=PAGE, max_context=2 * PAGE,
                               scratch_block=9)
    out, (q, k, v) = _policy_attention(FixedShapePolicy(attention_backend="auto"), canonical)
    assert [(c["batch"], c["num_splits"]) for c in fake_flash[1:]] == [(16, 1)]
    torch.testing.assert_close(out.float(), blocked_attention(q.float(), k.float(), v.float(), canonical,
                                                              block_size=PAGE, scale=0.17, key_block=64),
                               **TOLERANCE[q.dtype])

    prefill = _prefill_step()
    out, (q, k, v) = _policy_attention(FastPolicy(), prefill)
    assert len(fake_flash) == 2  # not called: the prefill step ran padded_attention, as before
    assert torch.equal(out, padded_attention(q, k, v, prefill, block_size=PAGE, scale=0.17))

    _policy_attention(NoisyFastPolicy(scale=1.0), decode)  # a subclass that never calls FastPolicy.__init__
    assert fake_flash[-1]["num_splits"] == 0 and len(fake_flash) == 3


def test_triton_backend_never_calls_flash(fake_flash, pretend_cuda):
    generator = torch.Generator().manual_seed(7)
    decode = decode_step(generator, num_seqs=3, num_blocks=9, block_size=PAGE, max_context=2 * PAGE)
    canonical = canonical_step(generator, num_rows=8, num_blocks=9, block_size=PAGE, max_context=2 * PAGE,
                               scratch_block=9)
    out, (q, k, v) = _policy_attention(FastPolicy(attention_backend="triton"), decode)
    assert torch.equal(out, padded_attention(q, k, v, decode, block_size=PAGE, scale=0.17))
    out, (q, k, v) = _policy_attention(FixedShapePolicy(attention_backend="triton"), canonical)
    assert torch.equal(out, blocked_attention(q, k, v, canonical, block_size=PAGE, scale=0.17, key_block=64))
    assert fake_flash == []


def test_flash_backend_requires_flash_attn(no_flash):
    for make in (lambda: FastPolicy(attention_backend="flash"),
                 lambda: FixedShapePolicy(16, attention_backend="flash")):
        with pytest.raises(ValueError, match="flash_attn"):
            make()


def test_flash_backend_raises_where_it_cannot_serve(fake_flash):
    generator = torch.Generator().manual_seed(8)
    decode = decode_step(generator, num_seqs=2, num_blocks=9, block_size=PAGE, max_context=PAGE)
    policy = FastPolicy(attention_backend="flash")
    with pytest.raises(ValueError, match="not on CUDA"):
        _policy_attention(policy, decode)
    assert fake_flash == []


def test_flash_backend_serves_decode_and_canonical(fake_flash, pretend_cuda):
    generator = torch.Generator().manual_seed(9)
    decode = decode_step(generator, num_seqs=2, num_blocks=9, block_size=PAGE, max_context=PAGE)
    _policy_attention(FastPolicy(attention_backend="flash"), decode)
    canonical = canonical_step(generator, num_rows=8, num_blocks=9, block_size=PAGE, max_context=PAGE,
                               scratch_block=9)
    _policy_attention(FixedShapePolicy(attention_backend="flash"), canonical)
    assert [(c["batch"], c["num_splits"]) for c in fake_flash] == [(2, 0), (8, 1)]
    with pytest.raises(ValueError, match="block_size 16"):
        _policy_attention(FastPolicy(attention_backend="flash"), decode_step(
            generator, num_seqs=2, num_blocks=40, block_size=16, max_context=50), block_size=16)


def test_backend_argument_is_validated_and_shown():
    with pytest.raises(ValueError, match="attention_backend"):
        FastPolicy(attention_backend="flashinfer")
    with pytest.raises(ValueError, match="attention_backend"):
        FixedShapePolicy(attention_backend="Triton")
    with pytest.raises(TypeError):
        FixedShapePolicy(64, "triton")  # keyword-only
    assert repr(FastPolicy()) == "FastPolicy()"
    assert repr(FixedShapePolicy()) == "FixedShapePolicy(key_block=64)"
    assert repr(FastPolicy(attention_backend="triton")) == "FastPolicy(attention_backend='triton')"
    assert repr(FixedShapePolicy(32, attention_backend="auto")) == \
        "FixedShapePolicy(key_block=32, attention_backend='auto')"


def test_is_available_is_probed_once(fake_flash, monkeypatch):
    assert flash.is_available()
    monkeypatch.setitem(sys.modules, "flash_attn", None)
    assert flash.is_available()  # cached
    flash.clear_cache()
    assert not flash.is_available()


# -- through the model -------------------------------------------------------------------------------------

def test_model_forward_through_flash_backend(fake_flash, pretend_cuda):
    """A canonical pass and a fast decode step of a bf16 model with 256-position blocks: flash-attn serves
    every layer (batch R / batch = sequences), and the logits match the policies' own kernels."""
    cfg = tiny_config(max_position_embeddings=512)
    weights = random_weights(cfg, seed=3, dtype=torch.bfloat16)
    runner = ModelRunner(weights, cfg)
    kv = KVStore(cfg, num_blocks=6, block_size=PAGE, num_scratch_slots=16, dtype=torch.bfloat16)
    params = SamplingParams()
    prompts = {0: [3 + i % 120 for i in range(297)], 1: [5, 6, 7, 8]}
    for rid, prompt in prompts.items():
        kv.allocate(rid, len(prompt) + 1)
        kv.append(rid, len(prompt))
    segments = [Segment(rid, tuple(p), 0, params, 0) for rid, p in prompts.items()]
    num_rows = 320
    inputs = runner.canonical_inputs(segments, kv, num_rows)
    ref = forward(weights, cfg, inputs, kv.layers(), FixedShapePolicy(attention_backend="triton"))
    out = forward(weights, cfg, inputs, kv.layers(), FixedShapePolicy(attention_backend="auto"))
    assert [(c["batch"], c["num_splits"]) for c in fake_flash] == [(num_rows, 1)] * cfg.num_layers
    real = len(prompts[0]) + len(prompts[1])
    torch.testing.assert_close(out[:real].float(), ref[:real].float(), rtol=0.05, atol=0.05)

    for rid in prompts:
        kv.append(rid, 1)
    decode = runner.fast_inputs([Segment(rid, (9,), len(p), params, 0) for rid, p in prompts.items()], kv)
    ref = forward(weights, cfg, decode, kv.layers(), FastPolicy(attention_backend="triton"))
    out = forward(weights, cfg, decode, kv.layers(), FastPolicy())
    assert [(c["batch"], c["num_splits"]) for c in fake_flash[cfg.num_layers:]] == [(2, 0)] * cfg.num_layers
    torch.testing.assert_close(out.float(), ref.float(), rtol=0.05, atol=0.05)


# -- the real flash-attn on CUDA (skips unless it imports) ---------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim,sliding_window", [(32, 8, 128, None), (16, 4, 64, 700)])
def test_real_flash_attn_matches_triton_kernels(num_heads, num_kv_heads, head_dim, sliding_window):
    pytest.importorskip("flash_attn")
    pytest.importorskip("triton")
    from llm42 import kernels

    flash.clear_cache()
    assert flash.is_available()
    dtype, device = torch.bfloat16, "cuda"
    generator = torch.Generator().manual_seed(11)
    num_blocks = 40
    k, v = paged_cache(generator, num_blocks=num_blocks + 1, block_size=PAGE, num_kv_heads=num_kv_heads,
                       head_dim=head_dim, dtype=dtype)
    k, v = k.to(device), v.to(device)
    scale = head_dim ** -0.5

    decode = decode_step(generator, num_seqs=6, num_blocks=num_blocks, block_size=PAGE, max_context=5 * PAGE)
    q = torch.randn(6, num_heads, head_dim, generator=generator).to(device=device, dtype=dtype)
    tables, lens = decode.block_tables.to(device), decode.context_lens.to(device)
    assert not flash.unsupported(q, k, v, block_size=PAGE)
    out = flash.decode_attention(q, k, v, tables, lens, block_size=PAGE, scale=scale, sliding_window=sliding_window)
    ref = kernels.paged_decode_attention(q, k, v, tables, lens, block_size=PAGE, scale=scale,
                                         sliding_window=sliding_window, max_context_len=decode.max_context_len)
    torch.testing.assert_close(out.float(), ref.float(), **TOLERANCE[dtype])

    num_rows = 64
    canonical = canonical_step(generator, num_rows=num_rows, num_blocks=num_blocks, block_size=PAGE,
                               max_context=5 * PAGE, scratch_block=num_blocks)
    q = torch.randn(num_rows, num_heads, head_dim, generator=generator).to(device=device, dtype=dtype)
    positions, row_seq = canonical.positions.to(device), canonical.row_seq.to(device)
    tables = canonical.block_tables.to(device)
    out = flash.canonical_attention(q, k, v, positions, row_seq, tables, block_size=PAGE, scale=scale,
                                    sliding_window=sliding_window)
    ref = kernels.canonical_attention(q, k, v, positions, row_seq, tables, block_size=PAGE, scale=scale,
                                      sliding_window=sliding_window)
    torch.testing.assert_close(out.float(), ref.float(), **TOLERANCE[dtype])

    # shape-closed: at a fixed R a row's bits do not depend on where it sits or what fills the other rows
    perm = torch.randperm(num_rows, generator=generator).to(device)
    moved = flash.canonical_attention(q[perm], k, v, positions[perm], row_seq, tables[perm], block_size=PAGE,
                                      scale=scale, sliding_window=sliding_window)
    assert torch.equal(moved, out[perm])
    alone = flash.canonical_attention(q[:1].expand(num_rows, -1, -1).contiguous(), k, v,
                                      positions[:1].expand(num_rows).contiguous(), row_seq,
                                      tables[:1].expand(num_rows, -1).contiguous(), block_size=PAGE, scale=scale,
                                      sliding_window=sliding_window)
    assert torch.equal(alone[0], out[0])


def test_canonical_default_never_uses_flash_attn(fake_flash, pretend_cuda):
    """Installing flash-attn must not change committed bits: the canonical policy only uses it when asked."""
    generator = torch.Generator().manual_seed(7)
    canonical = canonical_step(generator, num_rows=8, num_blocks=9, block_size=PAGE, max_context=2 * PAGE,
                               scratch_block=9)
    out, (q, k, v) = _policy_attention(FixedShapePolicy(), canonical)
    assert fake_flash == []
    assert FixedShapePolicy().attention_backend == "triton"
