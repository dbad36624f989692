"""Chunked canonical attention: a row's keys reduced in chunks fixed by absolute position, folded in order.

The tiled canonical kernel (``tiled_attention.py``) reduces a row's keys in one
ordered pass: its bits are its own, but a decode row then runs its whole context
in one program (a long context cannot be split without changing the bits). Here
the canonical reduction itself is cut at absolute positions ``0, C, 2C, ...``
(``key_chunk`` = C keys, a multiple of ``key_block``): within a chunk, key blocks
as the tiled kernel visits them (the same masked and unmasked steps, the same
fixed launch: the canonical config's ``tile_m`` M-rows, ``CANONICAL_TILE_WARPS``
warps, ``CANONICAL_TILE_STAGES`` stages, no FMA contraction), from a fresh softmax state;
the chunks' states are then folded left to right:

    m = max(M, m_c);  r = 0 if m == -inf else m
    L = L * 2^(M - r) + l_c * 2^(m_c - r);  A = A * 2^(M - r) + acc_c * 2^(m_c - r);  M = m

and the output is ``A / L`` (+0 for an exact zero). A chunk a row sees nothing of
leaves its state bit for bit (``2^0 = 1``, ``2^-inf = 0``), so the row's bits
depend on its own query, position and keys only, as with the tiled kernel.

Two launches give the same bits for a row:

- ``chunked_canonical_attention`` (the canonical pass, ``FixedShapePolicy(attention_kernel="chunked")``):
  packed tiles as the tiled canonical kernel, every chunk folded inside the program.
- ``chunked_canonical_decode_attention`` (the fast path's deterministic rows,
  ``FastPolicy(decode_kernel="deterministic", canonical_key_chunk=C)``): one
  program per (row, kv head, chunk) writes the chunk's state (m, l, acc in
  float32) and a second kernel folds them in the same order with the same
  operations — so a decode row's context is reduced in parallel, like the split-KV
  kernel's, and still gets the canonical pass's bits.

Its committed bits differ from the tiled kernel's (other reduction points): it is a
canonical-config choice, with ``key_chunk`` part of the canonical config.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from llm42.kernels.attention import (
    _LOG2E, _check_out, _check_shapes, _contiguous_rows, _dot_precision, _selection, _window,
)
from llm42.kernels.tiled_attention import (
    _BIG, CANONICAL_MASK_EVERY_BLOCK, CANONICAL_TILE_M, CANONICAL_TILE_STAGES, CANONICAL_TILE_WARPS,
    _block_pages, _check_canonical_groups, _full_step, _masked_step,
)



@triton.jit
def _chunk_range(acc, m_i, l_i, q, k_head_ptr, v_head_ptr, table_row_ptr, start, stop, full_lo, full_hi,
                 row_lo, row_hi, qk_scale, stride_k_slot, stride_v_slot, offs_d, d_mask,
                 PAGE: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
                 MASK_EVERY_BLOCK: tl.constexpr):
    # key blocks [start, stop) of one chunk, as the tiled kernel visits a group's blocks: masked where some row of
    # the group does not see a block in full, unmasked in [full_lo, full_hi) (the same bits for those rows)
    if MASK_EVERY_BLOCK:
        for key_start in range(start, stop, BLOCK_N):
            acc, m_i, l_i = _masked_step(
                acc, m_i, l_i, q, k_head_ptr, v_head_ptr, table_row_ptr, key_start, 0, row_lo, row_hi, qk_scale,
                stride_k_slot, stride_v_slot, offs_d, d_mask, PAGE, BLOCK_N, DOT_PRECISION, UPCAST, False,
            )
    else:
        for key_start in range(start, tl.minimum(full_lo, stop), BLOCK_N):
            acc, m_i, l_i = _masked_step(
                acc, m_i, l_i, q, k_head_ptr, v_head_ptr, table_row_ptr, key_start, 0, row_lo, row_hi, qk_scale,
                stride_k_slot, stride_v_slot, offs_d, d_mask, PAGE, BLOCK_N, DOT_PRECISION, UPCAST, False,
            )
        for key_start in range(tl.maximum(start, full_lo), tl.minimum(full_hi, stop), BLOCK_N):
            pages = _block_pages(table_row_ptr, key_start, tl.full([BLOCK_N], 1, tl.int1), PAGE, BLOCK_N, False)
            acc, m_i, l_i = _full_step(
                acc, m_i, l_i, q, k_head_ptr, v_head_ptr, pages, key_start, 0, qk_scale,
                stride_k_slot, stride_v_slot, offs_d, d_mask, PAGE, BLOCK_N, DOT_PRECISION, UPCAST, False,
            )
        for key_start in range(tl.maximum(tl.maximum(start, full_lo), full_hi), stop, BLOCK_N):
            acc, m_i, l_i = _masked_step(
                acc, m_i, l_i, q, k_head_ptr, v_head_ptr, table_row_ptr, key_start, 0, row_lo, row_hi, qk_scale,
                stride_k_slot, stride_v_slot, offs_d, d_mask, PAGE, BLOCK_N, DOT_PRECISION, UPCAST, False,
            )
    return acc, m_i, l_i


@triton.jit
def _chunk_state(q, k_head_ptr, v_head_ptr, table_row_ptr, chunk_start, first, grp_hi, full_lo, full_hi, row_lo,
                 row_hi, qk_scale, stride_k_slot, stride_v_slot, offs_d, d_mask,
                 BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
                 DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr, MASK_EVERY_BLOCK: tl.constexpr,
                 CHUNK: tl.constexpr):
    # the softmax state (acc, m, l) of one chunk's keys, from a fresh state: what is folded or stored
    m_c = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_c = tl.zeros([BLOCK_M], tl.float32)
    acc_c = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    return _chunk_range(
        acc_c, m_c, l_c, q, k_head_ptr, v_head_ptr, table_row_ptr, tl.maximum(first, chunk_start),
        tl.minimum(chunk_start + CHUNK, grp_hi), full_lo, full_hi, row_lo, row_hi, qk_scale,
        stride_k_slot, stride_v_slot, offs_d, d_mask, PAGE, BLOCK_N, DOT_PRECISION, UPCAST, MASK_EVERY_BLOCK,
    )


@triton.jit
def _fold_weights(M, m_c):
    # the fold's scales for the state so far and the chunk's (0 for a state that has seen no key)
    m_new = tl.maximum(M, m_c)
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    return m_new, tl.exp2(M - m_ref), tl.exp2(m_c - m_ref)


@triton.jit(do_not_specialize=["num_rows", "num_tiles", "window"])
def _chunked_attention_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, part_ptr, ml_ptr, pos_ptr, row_seq_ptr, tables_ptr, select_ptr, num_rows,
    num_tiles,
    stride_q_row, stride_q_head, stride_o_row, stride_o_head,
    stride_k_slot, stride_k_head, stride_v_slot, stride_v_head, stride_table,
    stride_p_row, stride_p_head, stride_p_chunk, stride_ml_row, stride_ml_head, stride_ml_chunk,
    qk_scale, window,
    GROUPS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, PAGE: tl.constexpr, HAS_WINDOW: tl.constexpr, DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr, ROWS: tl.constexpr, MASK_EVERY_BLOCK: tl.constexpr, SELECT: tl.constexpr,
    CHUNK: tl.constexpr, PARTIAL: tl.constexpr,
):
    # PARTIAL: program (tile, kv head, chunk) stores that chunk's state; else every chunk is folded here
    tile = num_tiles - 1 - tl.program_id(0)
    kv_head = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    rows = tile * ROWS + offs_m // GROUPS
    m_valid = (offs_m < ROWS * GROUPS) & (rows < num_rows)
    if SELECT != 0:
        flag = tl.load(select_ptr + rows, mask=m_valid, other=0)
        m_valid = m_valid & ((flag != 0) if SELECT == 2 else (flag == 0))
    rows = tl.where(m_valid, rows, 0)
    heads = kv_head * GROUPS + offs_m % GROUPS
    pos = tl.load(pos_ptr + rows, mask=m_valid, other=0).to(tl.int32)
    seq = tl.load(row_seq_ptr + rows, mask=m_valid, other=0).to(tl.int32)
    q_mask = m_valid[:, None] & d_mask[None, :]
    q = tl.load(q_ptr + rows[:, None].to(tl.int64) * stride_q_row + heads[:, None] * stride_q_head
                + offs_d[None, :], mask=q_mask, other=0.0)
    hi = pos + 1
    if HAS_WINDOW:
        lo = tl.maximum(hi - window, 0)
    else:
        lo = hi * 0
    k_head_ptr = k_ptr + kv_head * stride_k_head
    v_head_ptr = v_ptr + kv_head * stride_v_head
    done = m_valid == 0
    while tl.min(done.to(tl.int32)) == 0:
        lead = tl.min(tl.where(done, _BIG, seq))
        in_grp = (done == 0) & (seq == lead)
        row_lo = tl.where(in_grp, lo, _BIG)
        row_hi = tl.where(in_grp, hi, 0)
        grp_lo = tl.min(row_lo)
        grp_hi = tl.max(row_hi)
        table_row_ptr = tables_ptr + lead.to(tl.int64) * stride_table
        first = (grp_lo // BLOCK_N) * BLOCK_N
        full_lo = tl.cdiv(tl.max(tl.where(in_grp, lo, 0)), BLOCK_N) * BLOCK_N
        full_hi = (tl.min(tl.where(in_grp, hi, _BIG)) // BLOCK_N) * BLOCK_N
        first_chunk = (grp_lo // CHUNK) * CHUNK
        if PARTIAL:
            chunk_start = tl.program_id(2) * CHUNK
            acc_c, m_c, l_c = _chunk_state(
                q, k_head_ptr, v_head_ptr, table_row_ptr, chunk_start, first, grp_hi, full_lo, full_hi, row_lo,
                row_hi, qk_scale, stride_k_slot, stride_v_slot, offs_d, d_mask, BLOCK_M, BLOCK_D, PAGE, BLOCK_N,
                DOT_PRECISION, UPCAST, MASK_EVERY_BLOCK, CHUNK,
            )
            is_chunk = (chunk_start >= first_chunk) & (chunk_start < grp_hi)
            store = tl.where(is_chunk, in_grp, False)  # (a scalar & a vector: the interpreter gives no mask)
            chunk = tl.program_id(2)
            tl.store(part_ptr + rows[:, None].to(tl.int64) * stride_p_row + heads[:, None] * stride_p_head
                     + chunk * stride_p_chunk + offs_d[None, :], acc_c, mask=store[:, None] & d_mask[None, :])
            ml_row = ml_ptr + rows.to(tl.int64) * stride_ml_row + heads * stride_ml_head + chunk * stride_ml_chunk
            tl.store(ml_row, m_c, mask=store)
            tl.store(ml_row + 1, l_c, mask=store)
        else:
            m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
            l_i = tl.zeros([BLOCK_M], tl.float32)
            acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
            for chunk_start in range(first_chunk, grp_hi, CHUNK):
                acc_c, m_c, l_c = _chunk_state(
                    q, k_head_ptr, v_head_ptr, table_row_ptr, chunk_start, first, grp_hi, full_lo, full_hi, row_lo,
                    row_hi, qk_scale, stride_k_slot, stride_v_slot, offs_d, d_mask, BLOCK_M, BLOCK_D, PAGE, BLOCK_N,
                    DOT_PRECISION, UPCAST, MASK_EVERY_BLOCK, CHUNK,
                )
                m_i, a, b = _fold_weights(m_i, m_c)
                l_i = l_i * a + l_c * b
                acc = acc * a[:, None] + acc_c * b[:, None]
            out = acc / tl.where(in_grp, l_i, 1.0)[:, None]
            out = out + 0.0  # -0 -> +0
            tl.store(out_ptr + rows[:, None].to(tl.int64) * stride_o_row + heads[:, None] * stride_o_head
                     + offs_d[None, :], out.to(out_ptr.dtype.element_ty), mask=in_grp[:, None] & d_mask[None, :])
        done = done | in_grp


@triton.jit
def _chunk_fold_kernel(
    part_ptr, ml_ptr, out_ptr, pos_ptr, select_ptr,
    stride_p_row, stride_p_head, stride_p_chunk, stride_ml_row, stride_ml_head, stride_ml_chunk,
    stride_o_row, stride_o_head, window,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, HAS_WINDOW: tl.constexpr, SELECT: tl.constexpr,
    CHUNK: tl.constexpr,
):
    row = tl.program_id(0)
    head = tl.program_id(1)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    hi = tl.load(pos_ptr + row).to(tl.int32) + 1
    if SELECT != 0:
        flag = tl.load(select_ptr + row)
        keep = (flag != 0) if SELECT == 2 else (flag == 0)
        hi = tl.where(keep, hi, 0)
        d_mask = tl.where(keep, d_mask, False)
    if HAS_WINDOW:
        lo = tl.maximum(hi - window, 0)
    else:
        lo = hi * 0
    l_i = (hi * 0).to(tl.float32)
    m_i = l_i - float("inf")
    acc = tl.zeros([BLOCK_D], tl.float32)
    for chunk_start in range((lo // CHUNK) * CHUNK, hi, CHUNK):
        chunk = chunk_start // CHUNK
        ml_row = ml_ptr + row.to(tl.int64) * stride_ml_row + head * stride_ml_head + chunk * stride_ml_chunk
        m_c = tl.load(ml_row)
        l_c = tl.load(ml_row + 1)
        acc_c = tl.load(part_ptr + row.to(tl.int64) * stride_p_row + head * stride_p_head + chunk * stride_p_chunk
                        + offs_d, mask=d_mask, other=0.0)
        m_i, a, b = _fold_weights(m_i, m_c)
        l_i = l_i * a + l_c * b
        acc = acc * a + acc_c * b
    out = acc / tl.where(hi > 0, l_i, 1.0)
    out = out + 0.0
    tl.store(out_ptr + row.to(tl.int64) * stride_o_row + head * stride_o_head + offs_d,
             out.to(out_ptr.dtype.element_ty), mask=d_mask)


def _check_chunk(key_block: int, key_chunk: int) -> None:
    if (not isinstance(key_chunk, int) or isinstance(key_chunk, bool) or key_chunk < key_block
            or key_chunk % key_block):
        raise ValueError(f"key_chunk must be a multiple of key_block ({key_block}), got {key_chunk!r}")


def chunked_canonical_attention(
    q: torch.Tensor,  # [N, Hq, D]
    k_cache: torch.Tensor,  # [num_slots, Hkv, D]
    v_cache: torch.Tensor,  # [num_slots, Hkv, D]
    positions: torch.Tensor,  # [N] int64: each row sees keys [0, position] (or its window)
    row_seq: torch.Tensor,  # [N] int64: the block-table row of each query row; equal values = one sequence
    block_tables: torch.Tensor,  # [S, max_blocks] int64
    *,
    block_size: int,
    scale: float,
    key_block: int = 64,
    key_chunk: int,
    sliding_window: int | None = None,
    mask_every_block: bool | None = None,
    tile_m: int = CANONICAL_TILE_M,
) -> torch.Tensor:
    """The canonical pass's chunked attention (packed tiles, every chunk folded in the program); [N, Hq, D].
    ``tile_m``: the canonical config's tile height, as for ``tiled_canonical_attention``."""
    _check_canonical_groups(q, k_cache, tile_m)
    _check_chunk(key_block, key_chunk)
    return _launch(q, k_cache, v_cache, positions, row_seq, block_tables, block_size=block_size, scale=scale,
                   key_block=key_block, key_chunk=key_chunk, sliding_window=sliding_window,
                   mask_every_block=mask_every_block, rows_per_tile=None, only_rows=None, out=None, num_chunks=None,
                   tile_m=tile_m)


def chunked_canonical_decode_attention(
    q: torch.Tensor,  # [B, Hq, D]: one query row per sequence, at position context_lens[b] - 1
    k_cache: torch.Tensor,  # [num_slots, Hkv, D]
    v_cache: torch.Tensor,  # [num_slots, Hkv, D]
    block_tables: torch.Tensor,  # [B, max_blocks] int64
    context_lens: torch.Tensor,  # [B] int64, >= 1
    *,
    block_size: int,
    scale: float,
    max_context_len: int,
    key_block: int = 64,
    key_chunk: int,
    sliding_window: int | None = None,
    mask_every_block: bool | None = None,
    only_rows: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    tile_m: int = CANONICAL_TILE_M,
) -> torch.Tensor:
    """Decode rows with ``chunked_canonical_attention``'s bits, their chunks in parallel; [B, Hq, D].

    One program per (row, kv head, chunk) up to ``max_context_len`` (a host bound on ``context_lens``: a CUDA
    graph passes its capacity) stores each chunk's float32 state, ``B x Hq x ceil(max_context_len / key_chunk)
    x (D + 2)`` floats of scratch; a second kernel folds them per (row, head). ``only_rows`` ([B], nonzero =
    compute) and ``out`` as for ``tiled_canonical_decode_attention``.
    """
    _check_canonical_groups(q, k_cache, tile_m)
    _check_chunk(key_block, key_chunk)
    num_seqs = q.shape[0]
    return _launch(q, k_cache, v_cache, context_lens - 1, torch.arange(num_seqs, device=q.device), block_tables,
                   block_size=block_size, scale=scale, key_block=key_block, key_chunk=key_chunk,
                   sliding_window=sliding_window, mask_every_block=mask_every_block, rows_per_tile=1,
                   only_rows=only_rows, out=out, num_chunks=max(1, -(-max_context_len // key_chunk)), tile_m=tile_m)


def _launch(q, k_cache, v_cache, positions, row_seq, block_tables, *, block_size, scale, key_block, key_chunk,
            sliding_window, mask_every_block, rows_per_tile, only_rows, out, num_chunks, tile_m):
    num_rows = q.shape[0]
    num_heads, num_kv_heads, head_dim = _check_shapes(q, k_cache, v_cache)
    groups = num_heads // num_kv_heads
    if key_block < 16 or key_block & (key_block - 1):
        raise ValueError(f"the chunked attention kernels need key blocks of a power of two >= 16 keys, got {key_block}")
    has_window, window = _window(sliding_window)
    positions, row_seq, block_tables = _contiguous_rows(positions, row_seq, block_tables)
    out = torch.empty_like(q) if out is None else _check_out(out, q)
    if num_rows == 0:
        return out
    select, select_ptr = _selection(only_rows, num_rows, keep_flagged=True, like=positions)
    rows_per_tile = tile_m // groups if rows_per_tile is None else rows_per_tile
    num_tiles = -(-num_rows // rows_per_tile)
    is_partial = num_chunks is not None
    if is_partial:
        part = torch.empty((num_rows, num_heads, num_chunks, head_dim), device=q.device, dtype=torch.float32)
        ml = torch.empty((num_rows, num_heads, num_chunks, 2), device=q.device, dtype=torch.float32)
    else:
        part = torch.empty((1, 1, 1, 1), device=q.device, dtype=torch.float32)
        ml = torch.empty((1, 1, 1, 2), device=q.device, dtype=torch.float32)
    block_d = max(16, triton.next_power_of_2(head_dim))
    mask_every = CANONICAL_MASK_EVERY_BLOCK if mask_every_block is None else mask_every_block
    _chunked_attention_kernel[(num_tiles, num_kv_heads, num_chunks if is_partial else 1)](
        q, k_cache, v_cache, out, part, ml, positions, row_seq, block_tables, select_ptr, num_rows, num_tiles,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1), block_tables.stride(0),
        part.stride(0), part.stride(1), part.stride(2), ml.stride(0), ml.stride(1), ml.stride(2),
        scale * _LOG2E, window,
        GROUPS=groups, HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_M=tile_m, BLOCK_N=key_block,
        PAGE=block_size, HAS_WINDOW=has_window, DOT_PRECISION=_dot_precision(k_cache.dtype),
        UPCAST=q.device.type != "cuda", ROWS=rows_per_tile, MASK_EVERY_BLOCK=mask_every, SELECT=select,
        CHUNK=key_chunk, PARTIAL=is_partial,
        num_warps=CANONICAL_TILE_WARPS, num_stages=CANONICAL_TILE_STAGES, enable_fp_fusion=False,
    )
    if is_partial:
        _chunk_fold_kernel[(num_rows, num_heads)](
            part, ml, out, positions, select_ptr,
            part.stride(0), part.stride(1), part.stride(2), ml.stride(0), ml.stride(1), ml.stride(2),
            out.stride(0), out.stride(1), window,
            HEAD_DIM=head_dim, BLOCK_D=block_d, HAS_WINDOW=has_window, SELECT=select, CHUNK=key_chunk,
            num_warps=1, enable_fp_fusion=False,
        )
    return out
