"""Fused RMSNorm in Triton: one program per row, the same arithmetic as ``llm42.ops.norm.rms_norm``.

Statistics in float32, the normalised row cast back to the input dtype before
the weight multiply (as transformers does). Each row is reduced by its own
program in one fixed order, so a row's result never depends on the other rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, stride_x, stride_o, hidden, eps, BLOCK_H: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_H)
    mask = offs < hidden
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    xf = x.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(xf * xf, 0) / hidden + eps)
    h = (xf * inv_rms).to(x.dtype)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    out = w.to(tl.float32) * h.to(tl.float32)
    tl.store(out_ptr + row * stride_o + offs, out.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim of ``x`` [..., H] with ``weight`` [H]; returns ``x``'s shape and dtype."""
    hidden = x.shape[-1]
    if weight.shape != (hidden,):
        raise ValueError(f"rms_norm weight has shape {tuple(weight.shape)}, expected ({hidden},)")
    rows = x.reshape(-1, hidden)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out_dtype = torch.promote_types(weight.dtype, x.dtype)
    out = torch.empty(rows.shape, device=x.device, dtype=out_dtype)
    if rows.shape[0]:
        block_h = triton.next_power_of_2(hidden)
        _rms_norm_kernel[(rows.shape[0],)](
            rows, weight, out, rows.stride(0), out.stride(0), hidden, eps,
            BLOCK_H=block_h, num_warps=max(1, min(16, block_h // 256)),
        )
    return out.view(x.shape)
