"""Fused row-wise kernels in Triton: the small ops between the GEMMs and attention, one launch each.

- ``add_rms_norm``: residual add + RMSNorm, returning the normed rows and the new residual.
- ``rope_and_store``: optional per-head q/k RMSNorm (Qwen3), rotate-half RoPE on q and k,
  and the K/V writes into the flat paged cache, for every row and head in one launch (without
  the norm a program takes a whole row, all its heads; with it, one head).
- ``swiglu``: SiLU(gate) * up from the fused [gate; up] GEMM output.

Each computes what the unfused torch composition computes (``llm42.policies.base.TorchRowOps``),
rounding to the activation dtype wherever that composition does: the residual sums, the RoPE
products and sums, and SiLU * up follow it op for op, so the elementwise results are the same
bits; the RMSNorm statistics are float32 sums in Triton's order, as in ``llm42.kernels.rms_norm``.
Every program reads and writes the rows it owns and nothing else: a row's result never depends
on the other rows, how many there are, or where the row sits. Launch configurations depend on the
feature sizes only (never on the number of rows), and floating-point contraction is off, so a
product and a sum are never merged into one differently rounded FMA.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

SWIGLU_BLOCK = 1024
# rope_and_store without a q/k norm: True, one program per row (all its heads); False, one per (row, head), the
# launch before round 22 (the same bits: elementwise; kept for side-by-side timing)
ROPE_ROW_PROGRAMS = True


@triton.jit
def _add_rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr,
                         stride_x, stride_res, stride_o, stride_res_o, hidden, eps, BLOCK_H: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_H)
    mask = offs < hidden
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    res = tl.load(res_ptr + row * stride_res + offs, mask=mask, other=0.0)
    # the residual stream keeps the activation dtype, rounded as torch's add rounds it
    total = (res.to(tl.float32) + x.to(tl.float32)).to(x.dtype)
    tl.store(res_out_ptr + row * stride_res_o + offs, total, mask=mask)
    hf = total.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(hf * hf, 0) / hidden + eps)
    h = (hf * inv_rms).to(x.dtype)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    out = w.to(tl.float32) * h.to(tl.float32)
    tl.store(out_ptr + row * stride_o + offs, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rope_head(src_ptr, dst_ptr, norm_ptr, cos, sin, offs, offs_rot, sign, mask, eps,
               HEAD_DIM: tl.constexpr, HAS_NORM: tl.constexpr):
    # One head: [RMSNorm], then x * cos + rotate_half(x) * sin, each product and the sum
    # rounded to x's dtype as the torch composition rounds them.
    x = tl.load(src_ptr + offs, mask=mask, other=0.0)
    partner = tl.load(src_ptr + offs_rot, mask=mask, other=0.0)  # x[(d + D/2) % D]
    dtype = x.dtype
    if HAS_NORM:
        xf = x.to(tl.float32)
        inv_rms = tl.rsqrt(tl.sum(xf * xf, 0) / HEAD_DIM + eps)
        w = tl.load(norm_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        w_partner = tl.load(norm_ptr + offs_rot, mask=mask, other=0.0).to(tl.float32)
        x = (w * (xf * inv_rms).to(dtype).to(tl.float32)).to(dtype)
        partner = (w_partner * (partner.to(tl.float32) * inv_rms).to(dtype).to(tl.float32)).to(dtype)
    rotated = partner.to(tl.float32) * sign  # exact; keeps the sign of zeros as torch's negation does
    a = (x.to(tl.float32) * cos).to(dtype)
    b = (rotated * sin).to(dtype)
    out = (a.to(tl.float32) + b.to(tl.float32)).to(dtype)
    tl.store(dst_ptr + offs, out.to(dst_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rope_and_store_kernel(
    q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, q_norm_ptr, k_norm_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_q_row, stride_q_head, stride_k_row, stride_k_head, stride_v_row, stride_v_head, stride_cos, stride_sin,
    stride_qo_row, stride_qo_head, stride_kc_slot, stride_kc_head, stride_vc_slot, stride_vc_head, eps,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, HAS_NORM: tl.constexpr,
):
    # program (row, head): heads [0, NUM_HEADS) are query heads, the rest kv heads (K rotated, V copied)
    row = tl.program_id(0)
    head = tl.program_id(1)
    offs = tl.arange(0, BLOCK_D)
    mask = offs < HEAD_DIM
    is_first_half = offs < HEAD_DIM // 2
    offs_rot = tl.where(is_first_half, offs + HEAD_DIM // 2, offs - HEAD_DIM // 2)
    sign = tl.where(is_first_half, -1.0, 1.0)
    cos = tl.load(cos_ptr + row * stride_cos + offs, mask=mask, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + row * stride_sin + offs, mask=mask, other=0.0).to(tl.float32)
    if head < NUM_HEADS:
        _rope_head(q_ptr + row * stride_q_row + head * stride_q_head,
                   q_out_ptr + row * stride_qo_row + head * stride_qo_head,
                   q_norm_ptr, cos, sin, offs, offs_rot, sign, mask, eps, HEAD_DIM, HAS_NORM)
    else:
        kv_head = head - NUM_HEADS
        slot = tl.load(slot_ptr + row)
        _rope_head(k_ptr + row * stride_k_row + kv_head * stride_k_head,
                   k_cache_ptr + slot * stride_kc_slot + kv_head * stride_kc_head,
                   k_norm_ptr, cos, sin, offs, offs_rot, sign, mask, eps, HEAD_DIM, HAS_NORM)
        v = tl.load(v_ptr + row * stride_v_row + kv_head * stride_v_head + offs, mask=mask, other=0.0)
        tl.store(v_cache_ptr + slot * stride_vc_slot + kv_head * stride_vc_head + offs,
                 v.to(v_cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rope_tile(src_ptr, dst_ptr, stride_src_head, stride_dst_head, cos, sin, num_heads,
               HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    # _rope_head without the norm, for all of a row's ``num_heads`` heads as one [BLOCK_H, BLOCK_D] tile:
    # element for element the same operations in the same order
    heads = tl.arange(0, BLOCK_H)[:, None]
    offs = tl.arange(0, BLOCK_D)[None, :]
    mask = (heads < num_heads) & (offs < HEAD_DIM)
    is_first_half = offs < HEAD_DIM // 2
    offs_rot = tl.where(is_first_half, offs + HEAD_DIM // 2, offs - HEAD_DIM // 2)
    sign = tl.where(is_first_half, -1.0, 1.0)
    x = tl.load(src_ptr + heads * stride_src_head + offs, mask=mask, other=0.0)
    partner = tl.load(src_ptr + heads * stride_src_head + offs_rot, mask=mask, other=0.0)
    dtype = x.dtype
    rotated = partner.to(tl.float32) * sign
    a = (x.to(tl.float32) * cos).to(dtype)
    b = (rotated * sin).to(dtype)
    out = (a.to(tl.float32) + b.to(tl.float32)).to(dtype)
    tl.store(dst_ptr + heads * stride_dst_head + offs, out.to(dst_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rope_rows_kernel(
    q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_q_row, stride_q_head, stride_k_row, stride_k_head, stride_v_row, stride_v_head, stride_cos, stride_sin,
    stride_qo_row, stride_qo_head, stride_kc_slot, stride_kc_head, stride_vc_slot, stride_vc_head,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_HQ: tl.constexpr, BLOCK_HKV: tl.constexpr,
):
    # program (row): every query and kv head of one row (no q/k norm). A program per (row, head) moved 128
    # elements each: 2,048-row prompt chunks of the 8B shape ran at ~1/4 of the copy bandwidth (round 22)
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_D)[None, :]
    d_mask = offs < HEAD_DIM
    cos = tl.load(cos_ptr + row * stride_cos + offs, mask=d_mask, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + row * stride_sin + offs, mask=d_mask, other=0.0).to(tl.float32)
    _rope_tile(q_ptr + row * stride_q_row, q_out_ptr + row * stride_qo_row, stride_q_head, stride_qo_head,
               cos, sin, NUM_HEADS, HEAD_DIM, BLOCK_HQ, BLOCK_D)
    slot = tl.load(slot_ptr + row)
    _rope_tile(k_ptr + row * stride_k_row, k_cache_ptr + slot * stride_kc_slot, stride_k_head, stride_kc_head,
               cos, sin, NUM_KV_HEADS, HEAD_DIM, BLOCK_HKV, BLOCK_D)
    heads = tl.arange(0, BLOCK_HKV)[:, None]
    kv_mask = (heads < NUM_KV_HEADS) & d_mask
    v = tl.load(v_ptr + row * stride_v_row + heads * stride_v_head + offs, mask=kv_mask, other=0.0)
    tl.store(v_cache_ptr + slot * stride_vc_slot + heads * stride_vc_head + offs,
             v.to(v_cache_ptr.dtype.element_ty), mask=kv_mask)


@triton.jit
def _swiglu_kernel(gate_up_ptr, out_ptr, stride_in, stride_o, inter, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    gate = tl.load(gate_up_ptr + row * stride_in + cols, mask=mask, other=0.0)
    up = tl.load(gate_up_ptr + row * stride_in + inter + cols, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(gate.dtype)  # F.silu, rounded to the activation dtype
    out = act.to(tl.float32) * up.to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def _unit_stride_rows(x: torch.Tensor, width: int) -> torch.Tensor:
    rows = x.reshape(-1, width)
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def _norm_warps(block: int) -> int:
    return max(1, min(16, block // 256))


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``residual + x`` and its RMSNorm, in one pass; returns (normed, new residual), both ``x``'s shape.

    ``x`` and ``residual`` [..., H] share a dtype; ``weight`` is [H]. Neither input is modified.
    """
    hidden = x.shape[-1]
    if residual.shape != x.shape or residual.dtype != x.dtype:
        raise ValueError(f"add_rms_norm needs x and residual of one shape and dtype, got {tuple(x.shape)} "
                         f"{x.dtype} and {tuple(residual.shape)} {residual.dtype}")
    if weight.shape != (hidden,):
        raise ValueError(f"add_rms_norm weight has shape {tuple(weight.shape)}, expected ({hidden},)")
    x_rows, res_rows = _unit_stride_rows(x, hidden), _unit_stride_rows(residual, hidden)
    out = torch.empty(x_rows.shape, device=x.device, dtype=torch.promote_types(weight.dtype, x.dtype))
    res_out = torch.empty(x_rows.shape, device=x.device, dtype=x.dtype)
    if x_rows.shape[0]:
        block_h = triton.next_power_of_2(hidden)
        _add_rms_norm_kernel[(x_rows.shape[0],)](
            x_rows, res_rows, weight, out, res_out,
            x_rows.stride(0), res_rows.stride(0), out.stride(0), res_out.stride(0), hidden, eps,
            BLOCK_H=block_h, num_warps=_norm_warps(block_h), enable_fp_fusion=False,
        )
    return out.view(x.shape), res_out.view(x.shape)


def rope_and_store(
    q: torch.Tensor,  # [N, Hq, D]
    k: torch.Tensor,  # [N, Hkv, D]
    v: torch.Tensor,  # [N, Hkv, D]
    cos: torch.Tensor,  # [N, D], q's dtype: each row's table entry at its position
    sin: torch.Tensor,  # [N, D]
    k_cache: torch.Tensor,  # [num_slots, Hkv, D]
    v_cache: torch.Tensor,  # [num_slots, Hkv, D]
    slot_mapping: torch.Tensor,  # [N] int64: the cache slot each row's K/V goes to
    *,
    q_norm: torch.Tensor | None = None,  # [D]
    k_norm: torch.Tensor | None = None,  # [D]
    eps: float = 1e-6,
) -> torch.Tensor:
    """[q/k RMSNorm,] rotate-half RoPE on q and k, K/V written at ``slot_mapping``: one launch.

    Returns the rotated queries [N, Hq, D]. q, k and v may be strided views (e.g. of
    the fused qkv GEMM output) as long as the head dimension is contiguous.
    """
    num_rows, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    kv_shape = (num_rows, num_kv_heads, head_dim)
    if k.shape != kv_shape or v.shape != kv_shape or head_dim % 2:
        raise ValueError(f"rope_and_store shapes do not fit: q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)} (the head dim must be even)")
    if k_cache.shape[1:] != (num_kv_heads, head_dim) or v_cache.shape != k_cache.shape:
        raise ValueError(f"rope_and_store caches {tuple(k_cache.shape)} / {tuple(v_cache.shape)} do not fit "
                         f"{num_kv_heads} kv heads of dim {head_dim}")
    if cos.shape != (num_rows, head_dim) or sin.shape != cos.shape:
        raise ValueError(f"rope_and_store cos/sin must be [{num_rows}, {head_dim}], got {tuple(cos.shape)}")
    if slot_mapping.shape != (num_rows,):
        raise ValueError(f"rope_and_store slot_mapping must be [{num_rows}], got {tuple(slot_mapping.shape)}")
    if (q_norm is None) != (k_norm is None):
        raise ValueError("rope_and_store needs both q_norm and k_norm, or neither")
    if len({q.dtype, k.dtype, v.dtype, cos.dtype, sin.dtype}) != 1:
        raise ValueError("rope_and_store needs q, k, v, cos and sin in one dtype")
    if q_norm is not None and (q_norm.shape != (head_dim,) or k_norm.shape != (head_dim,)
                               or q_norm.dtype != q.dtype or k_norm.dtype != q.dtype):
        raise ValueError(f"rope_and_store q/k norm weights must be [{head_dim}] in {q.dtype}")
    if any(t.stride(-1) != 1 for t in (q, k, v, cos, sin, k_cache, v_cache)):
        raise ValueError("rope_and_store needs the head dimension contiguous")
    slot_mapping = slot_mapping if slot_mapping.stride(0) == 1 else slot_mapping.contiguous()
    q_out = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    if num_rows == 0:
        return q_out
    has_norm = q_norm is not None
    block_d = triton.next_power_of_2(head_dim)
    if not has_norm and ROPE_ROW_PROGRAMS:  # elementwise only: one program per row takes all its heads
        block_hq = triton.next_power_of_2(num_heads)
        _rope_rows_kernel[(num_rows,)](
            q, k, v, cos, sin, q_out, k_cache, v_cache, slot_mapping,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), cos.stride(0),
            sin.stride(0), q_out.stride(0), q_out.stride(1), k_cache.stride(0), k_cache.stride(1),
            v_cache.stride(0), v_cache.stride(1),
            NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, BLOCK_D=block_d,
            BLOCK_HQ=block_hq, BLOCK_HKV=triton.next_power_of_2(num_kv_heads),
            num_warps=max(1, min(8, block_hq * block_d // 512)), enable_fp_fusion=False,
        )
        return q_out
    _rope_and_store_kernel[(num_rows, num_heads + num_kv_heads)](
        q, k, v, cos, sin, q_norm if has_norm else q, k_norm if has_norm else k, q_out, k_cache, v_cache,
        slot_mapping,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), cos.stride(0), sin.stride(0),
        q_out.stride(0), q_out.stride(1), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0),
        v_cache.stride(1), eps,
        NUM_HEADS=num_heads, HEAD_DIM=head_dim, BLOCK_D=block_d, HAS_NORM=has_norm,
        num_warps=1 if block_d <= 128 else 2, enable_fp_fusion=False,
    )
    return q_out


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up for ``gate_up`` [..., 2I] holding [gate; up]; returns [..., I] in its dtype."""
    width = gate_up.shape[-1]
    if width % 2:
        raise ValueError(f"swiglu needs an even last dimension ([gate; up]), got {width}")
    inter = width // 2
    rows = _unit_stride_rows(gate_up, width)
    out = torch.empty((rows.shape[0], inter), device=gate_up.device, dtype=gate_up.dtype)
    if rows.shape[0] and inter:
        _swiglu_kernel[(rows.shape[0], triton.cdiv(inter, SWIGLU_BLOCK))](
            rows, out, rows.stride(0), out.stride(0), inter, BLOCK=SWIGLU_BLOCK, num_warps=4,
            enable_fp_fusion=False,
        )
    return out.view(*gate_up.shape[:-1], inter)
