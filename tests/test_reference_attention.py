"""The float64 attention reference the kernel tests compare against (``tests/gpu/test_kernels.py``): computed per
sequence with a mask, it must equal the row-by-row reference it replaced (which the GPU sessions spent seconds a test
on), for GQA, MHA, sliding windows and shuffled rows."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from tests.gpu.test_kernels import _reference_by_row, random_paged_cache, reference_attention  # noqa: E402


@pytest.mark.parametrize("num_heads, num_kv_heads, window", [(8, 2, None), (4, 4, None), (6, 3, 7), (4, 1, 1)])
def test_the_masked_reference_equals_the_row_by_row_one(num_heads, num_kv_heads, window):
    gen = torch.Generator().manual_seed(num_heads + num_kv_heads)
    k, v, tables = random_paged_cache(num_seqs=3, max_context=40, num_kv_heads=num_kv_heads, head_dim=8,
                                      block_size=4, dtype=torch.float32, device="cpu", generator=gen)
    rows = [(s, p) for s in range(3) for p in range(0, 40, 3)]
    order = torch.randperm(len(rows), generator=gen)
    row_seq = torch.tensor([rows[i][0] for i in order])
    positions = torch.tensor([rows[i][1] for i in order])
    q = torch.randn(len(rows), num_heads, 8, generator=gen)
    args = (q, k, v, tables, row_seq, positions)
    kwargs = dict(block_size=4, scale=8 ** -0.5, sliding_window=window)
    masked, by_row = reference_attention(*args, **kwargs), _reference_by_row(*args, **kwargs)
    assert masked.dtype == torch.float64 and masked.shape == q.shape
    torch.testing.assert_close(masked, by_row, rtol=1e-12, atol=1e-12)
    # the negative control: another window (or none) is another reference, so the comparison can fail
    other = _reference_by_row(*args, block_size=4, scale=8 ** -0.5, sliding_window=(window or 40) // 2 or None)
    assert not torch.allclose(masked, other, rtol=1e-6, atol=1e-6)
