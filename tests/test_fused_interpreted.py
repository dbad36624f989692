"""The fused RoPE + K/V-store kernel on the CPU, through Triton's interpreter, at small shapes.

Without a q/k norm a program takes a whole row (all its heads, ``_rope_rows_kernel``); its results must be the
bits of the unfused torch composition (``TorchRowOps``), element for element. ``tests/gpu/test_fused.py`` checks
the same at model shapes on a GPU.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from tests import triton_cpu  # noqa: E402

if not triton_cpu.is_interpreted():
    pytest.skip("Triton kernels are not interpreted here (a CUDA device: tests/gpu covers them)",
                allow_module_level=True)

from llm42.kernels import fused  # noqa: E402
from llm42.policies.base import TorchRowOps  # noqa: E402
from llm42.ops.norm import rms_norm  # noqa: E402


class _Unfused(TorchRowOps):
    def rms_norm(self, x, weight, eps):
        return rms_norm(x, weight, eps)


def _rope_case(num_rows, num_heads, num_kv_heads, head_dim, seed):
    gen = torch.Generator().manual_seed(seed)
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    qkv = torch.randn(num_rows, q_size + 2 * kv_size, generator=gen) * 2  # as the qkv GEMM leaves it: strided views
    q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    positions = torch.randint(0, 4096, (num_rows,), generator=gen)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    emb = torch.cat([positions.float()[:, None] * inv_freq[None, :]] * 2, dim=-1)
    num_slots = 2 * num_rows + 3
    slots = torch.randperm(num_slots, generator=gen)[:num_rows]
    return (q.reshape(num_rows, num_heads, head_dim), k.reshape(num_rows, num_kv_heads, head_dim),
            v.reshape(num_rows, num_kv_heads, head_dim), emb.cos(), emb.sin(), slots, num_slots)


@pytest.mark.parametrize("shape", [(5, 4, 2, 16), (3, 9, 3, 8), (4, 6, 6, 12)], ids=lambda s: "x".join(map(str, s)))
def test_a_row_program_gives_the_unfused_ops_bits(shape):
    num_rows, num_heads, num_kv_heads, head_dim = shape
    q, k, v, cos, sin, slots, num_slots = _rope_case(*shape, seed=sum(shape))
    caches = [torch.full((num_slots, num_kv_heads, head_dim), float("nan")) for _ in range(4)]
    out = fused.rope_and_store(q, k, v, cos, sin, caches[0], caches[1], slots)
    ref = _Unfused().rope_and_store(q, k, v, cos, sin, caches[2], caches[3], slots)
    assert torch.equal(out, ref)
    assert torch.equal(caches[0][slots], caches[2][slots]) and torch.equal(caches[1][slots], v)
    unwritten = torch.ones(num_slots, dtype=torch.bool)
    unwritten[slots] = False
    assert torch.isnan(caches[0][unwritten]).all() and torch.isnan(caches[1][unwritten]).all()
    # negative control: the same kernel on rows whose cos/sin are another position's differs from the reference
    shifted = fused.rope_and_store(q, k, v, cos.roll(1, 0), sin.roll(1, 0), caches[0], caches[1], slots)
    assert not torch.equal(shifted, ref)


def test_the_per_head_norm_path_stays_within_rounding_of_the_unfused_ops():
    q, k, v, cos, sin, slots, num_slots = _rope_case(4, 4, 2, 16, seed=7)
    gen = torch.Generator().manual_seed(8)
    norms = {name: 1 + 0.2 * torch.randn(16, generator=gen) for name in ("q_norm", "k_norm")}
    caches = [torch.zeros(num_slots, 2, 16) for _ in range(4)]
    out = fused.rope_and_store(q, k, v, cos, sin, caches[0], caches[1], slots, eps=1e-5, **norms)
    ref = _Unfused().rope_and_store(q, k, v, cos, sin, caches[2], caches[3], slots, eps=1e-5, **norms)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(caches[0][slots], caches[2][slots], rtol=1e-5, atol=1e-5)
