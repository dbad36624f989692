"""Triton kernels against float64 references, with fresh random inputs at several shapes.

Outputs are poisoned (NaN) by the references' comparison: every element must
be finite and close; the canonical kernel must also give a row the same bits
wherever it sits and whatever else fills the launch.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from llm42.kernels import canonical_attention, choose_num_splits, paged_decode_attention, rms_norm  # noqa: E402

pytestmark = pytest.mark.gpu
DEVICE = "cuda"
# bf16 operands: relative error between 1e-3 and 1e-2 is expected
TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 1e-4}


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out64 = out.double().cpu()
    if not torch.isfinite(out64).all():
        return float("inf")
    return float((out64 - ref).norm() / ref.norm())


def random_paged_cache(*, num_seqs, max_context, num_kv_heads, head_dim, block_size, dtype, device, generator):
    """A flat paged cache with a random (shuffled) block table per sequence and random contents."""
    blocks_per_seq = -(-max_context // block_size)
    num_blocks = num_seqs * blocks_per_seq + 3
    num_slots = num_blocks * block_size
    k = torch.randn(num_slots, num_kv_heads, head_dim, generator=generator).to(device=device, dtype=dtype)
    v = torch.randn(num_slots, num_kv_heads, head_dim, generator=generator).to(device=device, dtype=dtype)
    perm = torch.randperm(num_blocks, generator=generator)[: num_seqs * blocks_per_seq]
    tables = perm.view(num_seqs, blocks_per_seq).to(device=device, dtype=torch.int64)
    return k, v, tables


def reference_attention(q, k, v, tables, row_seq, positions, *, block_size, scale, sliding_window=None):
    """float64 attention of each row over keys [0, position] (or its window), gathered through the table; on the
    CPU. One masked attention per sequence over its keys up to its rows' last position (a query head h reads K/V
    head h // (heads / K/V heads)), not a loop over rows: the GPU sessions spent seconds a test on the loop."""
    q64, k64, v64 = q.double().cpu(), k.double().cpu(), v.double().cpu()
    tables, row_seq, positions = tables.cpu(), row_seq.cpu(), positions.cpu()
    num_rows, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    groups = num_heads // num_kv_heads
    out = torch.empty(q.shape, dtype=torch.float64)
    for seq in row_seq.unique().tolist():
        rows = (row_seq == seq).nonzero().squeeze(1)
        pos = positions[rows]
        key_pos = torch.arange(int(pos.max()) + 1)
        slots = tables[seq, key_pos // block_size] * block_size + key_pos % block_size
        keys, vals = k64[slots], v64[slots]  # [K, Hkv, D]
        qs = q64[rows].view(len(rows), num_kv_heads, groups, head_dim)
        scores = torch.einsum("nhgd,khd->nhgk", qs, keys) * scale
        visible = key_pos[None, :] <= pos[:, None]  # [n, K]
        if sliding_window is not None:
            visible &= key_pos[None, :] > pos[:, None] - sliding_window
        scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
        out[rows] = torch.einsum("nhgk,khd->nhgd", torch.softmax(scores, dim=-1), vals).reshape(
            len(rows), num_heads, head_dim)
    return out


def _reference_by_row(q, k, v, tables, row_seq, positions, *, block_size, scale, sliding_window=None):
    """The reference as first written, one row at a time: what ``reference_attention`` is checked against."""
    q64, k64, v64 = q.double().cpu(), k.double().cpu(), v.double().cpu()
    tables, row_seq, positions = tables.cpu(), row_seq.cpu(), positions.cpu()
    groups = q.shape[1] // k.shape[1]
    out = torch.empty(q.shape, dtype=torch.float64)
    for r in range(q.shape[0]):
        pos = int(positions[r])
        lo = 0 if sliding_window is None else max(0, pos + 1 - sliding_window)
        key_pos = torch.arange(lo, pos + 1)
        slots = tables[row_seq[r], key_pos // block_size] * block_size + key_pos % block_size
        keys = k64[slots].repeat_interleave(groups, dim=1)  # [K, Hq, D]
        vals = v64[slots].repeat_interleave(groups, dim=1)
        s = torch.einsum("hd,khd->hk", q64[r], keys) * scale
        out[r] = torch.einsum("hk,khd->hd", torch.softmax(s, dim=-1), vals)
    return out


DECODE_SHAPES = [
    # (num_seqs, num_heads, num_kv_heads, head_dim, block_size, max_context, sliding_window, num_splits)
    (1, 32, 8, 128, 16, 1030, None, None),
    (5, 32, 8, 128, 16, 300, None, 7),
    (3, 8, 8, 64, 32, 200, None, 3),
    (17, 12, 4, 96, 16, 150, None, None),
    (4, 16, 2, 128, 16, 500, 100, 4),
    (64, 32, 8, 128, 16, 96, None, 1),
]


@pytest.mark.parametrize("shape", DECODE_SHAPES, ids=lambda s: "x".join(str(v) for v in s))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_paged_decode_attention_matches_float64(shape, dtype, device=DEVICE):
    num_seqs, num_heads, num_kv_heads, head_dim, block_size, max_context, window, num_splits = shape
    gen = torch.Generator().manual_seed(sum(v or 0 for v in shape))
    k, v, tables = random_paged_cache(num_seqs=num_seqs, max_context=max_context, num_kv_heads=num_kv_heads,
                                      head_dim=head_dim, block_size=block_size, dtype=dtype, device=device,
                                      generator=gen)
    context_lens = torch.randint(1, max_context + 1, (num_seqs,), generator=gen)
    context_lens[0] = max_context
    q = torch.randn(num_seqs, num_heads, head_dim, generator=gen).to(device=device, dtype=dtype)
    scale = head_dim**-0.5
    out = paged_decode_attention(q, k, v, tables, context_lens.to(device), block_size=block_size, scale=scale,
                                 sliding_window=window, num_splits=num_splits, max_context_len=max_context)
    ref = reference_attention(q, k, v, tables, torch.arange(num_seqs), context_lens - 1,
                              block_size=block_size, scale=scale, sliding_window=window)
    assert relative_error(out, ref) < TOLERANCE[dtype]


CANONICAL_SHAPES = [
    # (num_rows, num_seqs, num_heads, num_kv_heads, head_dim, block_size, max_context, key_block, sliding_window)
    (64, 4, 32, 8, 128, 16, 700, 64, None),
    (40, 3, 8, 8, 64, 32, 300, 32, None),
    (33, 5, 12, 4, 96, 16, 257, 16, None),
    (48, 2, 16, 2, 128, 16, 400, 64, 50),
]


@pytest.mark.parametrize("shape", CANONICAL_SHAPES, ids=lambda s: "x".join(str(v) for v in s))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_canonical_attention_matches_float64(shape, dtype, device=DEVICE):
    num_rows, num_seqs, num_heads, num_kv_heads, head_dim, block_size, max_context, key_block, window = shape
    gen = torch.Generator().manual_seed(sum(v or 0 for v in shape))
    k, v, tables = random_paged_cache(num_seqs=num_seqs, max_context=max_context, num_kv_heads=num_kv_heads,
                                      head_dim=head_dim, block_size=block_size, dtype=dtype, device=device,
                                      generator=gen)
    # prefill-like runs of consecutive positions and lone decode rows, in any order
    row_seq = torch.randint(0, num_seqs, (num_rows,), generator=gen)
    positions = torch.randint(0, max_context, (num_rows,), generator=gen)
    positions[:8] = torch.arange(8)
    q = torch.randn(num_rows, num_heads, head_dim, generator=gen).to(device=device, dtype=dtype)
    scale = head_dim**-0.5
    out = canonical_attention(q, k, v, positions.to(device), row_seq.to(device), tables, block_size=block_size,
                              scale=scale, key_block=key_block, sliding_window=window)
    ref = reference_attention(q, k, v, tables, row_seq, positions, block_size=block_size, scale=scale,
                              sliding_window=window)
    assert relative_error(out, ref) < TOLERANCE[dtype]


def test_canonical_attention_row_is_invariant_to_batch_and_placement(device=DEVICE, dtype=torch.bfloat16):
    """A row's output bits depend on its own query and keys only: not on the other rows or its index."""
    gen = torch.Generator().manual_seed(7)
    num_heads, num_kv_heads, head_dim, block_size = 32, 8, 128, 16
    k, v, tables = random_paged_cache(num_seqs=6, max_context=1200, num_kv_heads=num_kv_heads, head_dim=head_dim,
                                      block_size=block_size, dtype=dtype, device=device, generator=gen)
    probe_q = torch.randn(1, num_heads, head_dim, generator=gen).to(device=device, dtype=dtype)
    probe_pos, probe_seq = 911, 2
    outputs = []
    for num_rows in (1, 7, 64, 256):
        for index in sorted({0, num_rows // 2, num_rows - 1}):
            q = torch.randn(num_rows, num_heads, head_dim, generator=gen).to(device=device, dtype=dtype)
            positions = torch.randint(0, 1200, (num_rows,), generator=gen)
            row_seq = torch.randint(0, 6, (num_rows,), generator=gen)
            q[index] = probe_q[0]
            positions[index], row_seq[index] = probe_pos, probe_seq
            out = canonical_attention(q, k, v, positions.to(device), row_seq.to(device), tables,
                                      block_size=block_size, scale=head_dim**-0.5)
            outputs.append(out[index].clone())
    assert all(torch.equal(outputs[0], o) for o in outputs[1:])


def test_decode_num_splits_changes_bits_not_values(device=DEVICE, dtype=torch.bfloat16):
    """The fast kernel's result depends on the split count (why it is not canonical), within rounding."""
    gen = torch.Generator().manual_seed(11)
    k, v, tables = random_paged_cache(num_seqs=2, max_context=2048, num_kv_heads=8, head_dim=128, block_size=16,
                                      dtype=dtype, device=device, generator=gen)
    q = torch.randn(2, 32, 128, generator=gen).to(device=device, dtype=dtype)
    ctx = torch.tensor([2048, 1500], device=device)
    outs = [paged_decode_attention(q, k, v, tables, ctx, block_size=16, scale=128**-0.5, num_splits=s)
            for s in (1, 2, 5, 16, 32)]
    ref = reference_attention(q, k, v, tables, torch.arange(2), ctx.cpu() - 1, block_size=16, scale=128**-0.5)
    for o in outs:
        assert relative_error(o, ref) < TOLERANCE[dtype]
    assert len({o.float().cpu().numpy().tobytes() for o in outs}) > 1


def test_choose_num_splits_fills_the_chip():
    assert choose_num_splits(1, 8, 1024, num_sms=132) == 16  # one split per key block at most
    assert choose_num_splits(1, 8, 100_000, num_sms=132) == 32
    assert choose_num_splits(128, 8, 1024, num_sms=132) == 1
    assert choose_num_splits(8, 8, 1024, num_sms=132) == 13  # 6 waves: 792 programs over 64 (sequence, head)s
    assert choose_num_splits(8, 8, 1024, num_sms=132, waves=2) == 5
    assert choose_num_splits(96, 3, 4096, num_sms=132) == 3  # 288 programs: 6 waves want 3 splits
    assert choose_num_splits(176, 3, 4096, num_sms=132) == 1  # 528 programs fill 4 waves: one split


@pytest.mark.parametrize("rows,hidden", [(1, 4096), (37, 4096), (300, 5120), (64, 128)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rms_norm_matches_float64(rows, hidden, dtype, device=DEVICE):
    gen = torch.Generator().manual_seed(rows * hidden)
    x = (torch.randn(rows, hidden, generator=gen) * 3).to(device=device, dtype=dtype)
    w = (1 + 0.1 * torch.randn(hidden, generator=gen)).to(device=device, dtype=dtype)
    out = rms_norm(x, w, 1e-5)
    x64 = x.double().cpu()
    ref = w.double().cpu() * x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-5)
    assert out.dtype == dtype and out.shape == x.shape
    assert relative_error(out, ref) < TOLERANCE[dtype]
