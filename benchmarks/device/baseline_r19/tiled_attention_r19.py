"""Tiled paged attention (FlashAttention-2 style): query tiles of one sequence share each key block's loads.

The row kernel (``canonical_attention``) runs one program per (row, kv head), so
the n rows of one prompt chunk each read every key: n times the K/V traffic.
Here a program owns a *tile* of consecutive query rows (``BLOCK_M`` M-rows =
``BLOCK_M // G`` query rows x the G query heads of one kv head, GQA packing),
loads each key block once and multiplies it with the whole tile.

Rows with the same ``row_seq`` (the same block-table row: one sequence) form a
*group*. A tile normally holds one group; where it holds several (the ends of
two prompt chunks, decode rows next to prefill rows, padding rows), the
program runs one pass per group, in the order of their ``row_seq``, each pass
with its own online-softmax state and its own key range, and stores only that
group's rows. The static layouts (the canonical pass, the fast prefill graphs)
give every row its own copy of its sequence's block table; they pass
``StepInputs.table_rows`` (each row's first row of the same sequence) so that
one sequence's rows form one group there too.

Two launches of one kernel:

- ``tiled_prefill_attention`` (fast path). Per group: key blocks that some
  row of the group cannot fully see are masked; the blocks every row of the
  group sees in full run without masks. The launch configuration follows the
  number of rows. Results may drift with the batch.
- ``tiled_canonical_attention`` (canonical pass). One fixed launch
  configuration (``CANONICAL_TILE_M`` M-rows, ``key_block`` keys per block,
  ``CANONICAL_TILE_WARPS`` warps, ``CANONICAL_TILE_STAGES`` stages, no FMA
  contraction): it is part of the canonical config. Key blocks are visited
  in order from the block holding the group's first visible key, aligned at
  absolute position 0. A block that some row of the group cannot fully see
  goes through the masked step: for a row that sees no key of it the step
  keeps the row's state as it was (m, l and acc are selected, not recomputed:
  bit-for-bit unchanged); for a row that does, the step's arithmetic reads
  that row's query, its visible scores (the others are exactly -inf, so
  p = +0 there) and the keys alone. A block every row of the group sees in
  full skips the masks (the unmasked step); for each of those rows the masked
  step's selections would all pick the computed values, so the two steps do
  the same arithmetic on the same operands and give the row the same bits
  (``CANONICAL_MASK_EVERY_BLOCK = True`` sends every block through the masked
  step; the GPU suite checks both launches bit for bit). So a row's bits
  depend on its own query, position and keys only: not on which rows share
  its tile, how far their key ranges reach, where it sits, or how many rows
  the launch has. An output that is exactly zero is stored as +0 (a zero
  product's sign may follow a neighbour's V entry).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from llm42.engine.config import check_tile_m
from llm42.kernels.attention import (
    _LOG2E, _check_out, _check_shapes, _contiguous_rows, _dot_precision, _selection, _window,
)

# the canonical launch configuration: part of the canonical config (changing it changes committed bits)
CANONICAL_TILE_M = 64
# the tile heights a canonical config may name: ``llm42.engine.config.CANONICAL_TILE_HEIGHTS`` (64 and 128). On the
# H200 the two (4 warps, 2 stages) gave every row sampled the same bits (round 17, benchmarks/device/tile_m_bits.py):
# a measurement of one GPU, not a property of the kernel, so each height is its own canonical config
CANONICAL_TILE_WARPS = 4
CANONICAL_TILE_STAGES = 2
# True: every key block of the canonical launch goes through the masked step. False: the blocks every row
# of a group sees in full skip the masks, as on the fast path (the same arithmetic for those rows)
CANONICAL_MASK_EVERY_BLOCK = False
# the fast path's configurations (block_m, block_n, warps, stages), small and large launches: the fastest
# of benchmarks/device/attention_bench.py's sweep on an H200 (8B shape) at 512 rows, and of
# prefill_chunk_attention.py's at 2,048-row chunks of 8K-15K prompts with the page-id prefetch (round 19)
PREFILL_SMALL = (64, 64, 4, 2)
PREFILL_LARGE = (128, 128, 8, 3)
PREFILL_LARGE_MIN_M_ROWS = 4096  # query rows x group size from which the large tiles are used
# launches of at least this many warps load the next key block's page ids while a block runs (round 19, call D:
# 8-warp fast configs gained 6-32 % on an 8B 15K prompt's chunks, 4-warp ones lost 10-30 %: their tiles already
# spill registers). The same values either way: the canonical launch (4 warps) is untouched by it
PREFETCH_MIN_WARPS = 8
_BIG = tl.constexpr(2147483647)  # a global a Triton kernel reads must be a constexpr


@triton.jit
def _dot(a, b, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    # UPCAST: Triton's interpreter (CPU) multiplies 16-bit floats wrongly; fp32 copies hold the same values
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b, input_precision=DOT_PRECISION)


@triton.jit
def _block_pages(table_row_ptr, key_start, key_ok, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
                 KV_TMA: tl.constexpr):
    # The pages of keys [key_start, key_start + BLOCK_N): [N] page ids (0 where key_ok is False), or with KV_TMA
    # the block's one page (0 where no key is ok). Nothing outside the ok keys' table entries is read.
    # (one return: Triton checks every return of a function against the others, pruned branches too)
    if KV_TMA:
        pages = tl.load(table_row_ptr + key_start // PAGE, mask=tl.max(key_ok.to(tl.int32), 0) > 0, other=0)
    else:
        pages = tl.load(table_row_ptr + (key_start + tl.arange(0, BLOCK_N)) // PAGE, mask=key_ok, other=0)
    return pages


@triton.jit
def _load_keys(k_src, v_src, pages, key_start, kv_col, key_any, stride_k_slot, stride_v_slot, offs_d, d_mask,
               PAGE: tl.constexpr, BLOCK_N: tl.constexpr, KV_TMA: tl.constexpr, MASKED: tl.constexpr):
    # K and V of keys [key_start, key_start + BLOCK_N), [N, D] each, at ``pages`` (_block_pages). MASKED: keys
    # where key_any is False read as 0 (they may be unwritten slots, even NaN); else every key is read. KV_TMA:
    # the block lies in one page (PAGE % BLOCK_N == 0) and comes through TMA descriptors over the flat cache, one
    # box each; otherwise k_src / v_src are the kv head's pointers and each key is its own gather.
    if KV_TMA:
        slot = (pages * PAGE + key_start % PAGE).to(tl.int32)
        k = k_src.load([slot, kv_col])
        v = v_src.load([slot, kv_col])
        if MASKED:  # a box reads whole: zero what the gather's masked loads would not have read
            k = tl.where(key_any[:, None], k, 0.0)
            v = tl.where(key_any[:, None], v, 0.0)
    else:
        key_pos = key_start + tl.arange(0, BLOCK_N)
        if MASKED:
            kv_mask = key_any[:, None] & d_mask[None, :]
        else:
            kv_mask = d_mask[None, :]
        slot = pages.to(tl.int64) * PAGE + key_pos % PAGE
        k = tl.load(k_src + slot[:, None] * stride_k_slot + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_src + slot[:, None] * stride_v_slot + offs_d[None, :], mask=kv_mask, other=0.0)
    return k, v


@triton.jit
def _masked_step(acc, m_i, l_i, q, k_src, v_src, table_row_ptr, key_start, kv_col, row_lo, row_hi, qk_scale,
                 stride_k_slot, stride_v_slot, offs_d, d_mask,
                 PAGE: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
                 KV_TMA: tl.constexpr):
    # Keys [key_start, key_start + BLOCK_N); M-row i sees keys [row_lo[i], row_hi[i]) (empty for rows outside
    # the pass's group). A row that sees none of these keys keeps its state exactly.
    key_pos = key_start + tl.arange(0, BLOCK_N)
    vis = (key_pos[None, :] >= row_lo[:, None]) & (key_pos[None, :] < row_hi[:, None])  # [M, N]
    row_any = tl.max(vis.to(tl.int32), 1) > 0  # [M]
    key_any = tl.max(vis.to(tl.int32), 0) > 0  # [N]: keys some row sees; the others are never read
    pages = _block_pages(table_row_ptr, key_start, key_any, PAGE, BLOCK_N, KV_TMA)
    k, v = _load_keys(k_src, v_src, pages, key_start, kv_col, key_any, stride_k_slot, stride_v_slot, offs_d,
                      d_mask, PAGE, BLOCK_N, KV_TMA, True)
    s = _dot(q, tl.trans(k), DOT_PRECISION, UPCAST) * qk_scale  # [M, N], log2 domain
    s = tl.where(vis, s, float("-inf"))
    m_new = tl.where(row_any, tl.maximum(m_i, tl.max(s, 1)), m_i)
    m_sub = tl.where(row_any, m_new, 0.0)  # finite: rows that see nothing compute on zeros, then are not updated
    alpha = tl.exp2(m_i - m_sub)
    p = tl.exp2(s - m_sub[:, None])  # exactly +0 wherever a row cannot see the key
    l_new = l_i * alpha + tl.sum(p, 1)
    acc_new = acc * alpha[:, None] + _dot(p.to(v.dtype), v, DOT_PRECISION, UPCAST)
    acc = tl.where(row_any[:, None], acc_new, acc)
    l_i = tl.where(row_any, l_new, l_i)
    return acc, m_new, l_i


@triton.jit
def _full_step(acc, m_i, l_i, q, k_src, v_src, pages, key_start, kv_col, qk_scale,
               stride_k_slot, stride_v_slot, offs_d, d_mask,
               PAGE: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
               KV_TMA: tl.constexpr):
    # A key block every row of the group sees in full, at ``pages`` (_block_pages, loaded by the caller: the
    # loop loads the next block's while this one runs): no masks. Rows outside the group compute garbage here;
    # they are never stored by this pass.
    k, v = _load_keys(k_src, v_src, pages, key_start, kv_col, d_mask, stride_k_slot, stride_v_slot, offs_d,
                      d_mask, PAGE, BLOCK_N, KV_TMA, False)
    scores = _dot(q, tl.trans(k), DOT_PRECISION, UPCAST)  # [M, N]
    # max(scores) x qk_scale is max(scores x qk_scale) bit for bit (rounding is monotonic, qk_scale > 0), and
    # scores x qk_scale - m is one FMA where the launch contracts (the fast path) and the masked step's two
    # roundings where it does not (the canonical launch): the same bits there as the masked step's arithmetic
    m_new = tl.maximum(m_i, tl.max(scores, 1) * qk_scale)
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(scores * qk_scale - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, DOT_PRECISION, UPCAST)
    return acc, m_new, l_i


@triton.jit(do_not_specialize=["num_rows", "num_tiles", "window"])
def _tiled_attention_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, pos_ptr, row_seq_ptr, tables_ptr, select_ptr, tiles_ptr, num_rows, num_tiles,
    stride_q_row, stride_q_head, stride_o_row, stride_o_head,
    stride_k_slot, stride_k_head, stride_v_slot, stride_v_head, stride_table,
    qk_scale, window,
    GROUPS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, PAGE: tl.constexpr, HAS_WINDOW: tl.constexpr, DOT_PRECISION: tl.constexpr,
    IS_CANONICAL: tl.constexpr, UPCAST: tl.constexpr, ROWS: tl.constexpr, MASK_EVERY_BLOCK: tl.constexpr,
    SELECT: tl.constexpr, TILE_TABLE: tl.constexpr, KV_TMA: tl.constexpr, PREFETCH: tl.constexpr,
):
    # KV_TMA: k_ptr / v_ptr are TMA descriptors over the flat caches seen as [num_slots, Hkv * D], boxes of
    # [BLOCK_N, D] (see _load_keys); the loaded values and every operation on them are the pointer path's
    # ROWS query rows per tile (at most BLOCK_M // GROUPS; M-rows past ROWS x GROUPS are padding, never stored)
    tile = num_tiles - 1 - tl.program_id(0)  # the tiles with the longest key ranges (usually the last) first
    kv_head = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    if TILE_TABLE:  # tile t: rows [tiles[t], tiles[t + 1]) (at most ROWS of them; none past the last tile)
        first_row = tl.load(tiles_ptr + tile)
        end_row = tl.minimum(tl.load(tiles_ptr + tile + 1), num_rows)
    else:  # tile t: rows [t ROWS, (t + 1) ROWS)
        first_row = tile * ROWS
        end_row = num_rows
    rows = first_row + offs_m // GROUPS
    m_valid = (offs_m < ROWS * GROUPS) & (rows < end_row)
    if SELECT != 0:  # only the rows whose flag is 0 (SELECT 1) or nonzero (SELECT 2); the others are not rows here
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
    kv_col = kv_head * HEAD_DIM
    if KV_TMA:
        k_src = k_ptr
        v_src = v_ptr
    else:
        k_src = k_ptr + kv_head * stride_k_head
        v_src = v_ptr + kv_head * stride_v_head
    done = m_valid == 0
    while tl.min(done.to(tl.int32)) == 0:
        # one pass per group (rows of one sequence), the smallest row_seq first
        lead = tl.min(tl.where(done, _BIG, seq))
        in_grp = (done == 0) & (seq == lead)
        row_lo = tl.where(in_grp, lo, _BIG)
        row_hi = tl.where(in_grp, hi, 0)
        grp_lo = tl.min(row_lo)
        grp_hi = tl.max(row_hi)
        table_row_ptr = tables_ptr + lead.to(tl.int64) * stride_table
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        first = (grp_lo // BLOCK_N) * BLOCK_N
        if MASK_EVERY_BLOCK:
            # every block through the same masked step, aligned at 0, in order: a row's arithmetic is its own
            for key_start in range(first, grp_hi, BLOCK_N):
                acc, m_i, l_i = _masked_step(
                    acc, m_i, l_i, q, k_src, v_src, table_row_ptr, key_start, kv_col, row_lo, row_hi, qk_scale,
                    stride_k_slot, stride_v_slot, offs_d, d_mask, PAGE, BLOCK_N, DOT_PRECISION, UPCAST, KV_TMA,
                )
        else:
            # blocks [full_lo, full_hi) are seen in full by every row of the group: no masks there. For such a
            # row the masked step's selections all pick the computed values, so both steps do the same
            # arithmetic on the same operands (the canonical launch relies on it; the GPU suite checks it)
            full_lo = tl.cdiv(tl.max(tl.where(in_grp, lo, 0)), BLOCK_N) * BLOCK_N
            full_hi = (tl.min(tl.where(in_grp, hi, _BIG)) // BLOCK_N) * BLOCK_N
            for key_start in range(first, tl.minimum(full_lo, grp_hi), BLOCK_N):
                acc, m_i, l_i = _masked_step(
                    acc, m_i, l_i, q, k_src, v_src, table_row_ptr, key_start, kv_col, row_lo, row_hi, qk_scale,
                    stride_k_slot, stride_v_slot, offs_d, d_mask, PAGE, BLOCK_N, DOT_PRECISION, UPCAST, KV_TMA,
                )
            # PREFETCH: the page ids of the next block are loaded while this one runs (no K/V load waits on a
            # table load); else each block loads its own first. The same values either way
            offs_n = tl.arange(0, BLOCK_N)
            pages = _block_pages(table_row_ptr, full_lo, full_lo + offs_n < full_hi, PAGE, BLOCK_N, KV_TMA)
            for key_start in range(full_lo, full_hi, BLOCK_N):
                if PREFETCH:
                    next_pages = _block_pages(table_row_ptr, key_start + BLOCK_N,
                                              key_start + BLOCK_N + offs_n < full_hi, PAGE, BLOCK_N, KV_TMA)
                else:
                    pages = _block_pages(table_row_ptr, key_start, key_start + offs_n < full_hi, PAGE, BLOCK_N, KV_TMA)
                    next_pages = pages
                acc, m_i, l_i = _full_step(
                    acc, m_i, l_i, q, k_src, v_src, pages, key_start, kv_col, qk_scale,
                    stride_k_slot, stride_v_slot, offs_d, d_mask, PAGE, BLOCK_N, DOT_PRECISION, UPCAST, KV_TMA,
                )
                pages = next_pages
            for key_start in range(tl.maximum(full_lo, full_hi), grp_hi, BLOCK_N):
                acc, m_i, l_i = _masked_step(
                    acc, m_i, l_i, q, k_src, v_src, table_row_ptr, key_start, kv_col, row_lo, row_hi, qk_scale,
                    stride_k_slot, stride_v_slot, offs_d, d_mask, PAGE, BLOCK_N, DOT_PRECISION, UPCAST, KV_TMA,
                )
        out = acc / tl.where(in_grp, l_i, 1.0)[:, None]
        if IS_CANONICAL:
            out = out + 0.0  # -0 -> +0: an exactly zero output never carries a neighbour's sign
        tl.store(out_ptr + rows[:, None].to(tl.int64) * stride_o_row + heads[:, None] * stride_o_head
                 + offs_d[None, :], out.to(out_ptr.dtype.element_ty), mask=in_grp[:, None] & d_mask[None, :])
        done = done | in_grp


def _launch(q, k_cache, v_cache, positions, row_seq, block_tables, *, block_size, scale, sliding_window,
            block_m, block_n, num_warps, num_stages, is_canonical, rows_per_tile=None, fp_fusion=None,
            mask_every_block=None, only_rows=None, out=None, tiles=None, kv_tma=None):
    num_rows = q.shape[0]
    num_heads, num_kv_heads, head_dim = _check_shapes(q, k_cache, v_cache)
    groups = num_heads // num_kv_heads
    if block_m < groups or block_m & (block_m - 1) or block_m < 16:
        raise ValueError(f"block_m must be a power of two >= 16 and >= the group size {groups}, got {block_m}")
    if block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"the tiled attention kernels need key blocks of a power of two >= 16 keys, got {block_n}")
    has_window, window = _window(sliding_window)
    positions, row_seq, block_tables = _contiguous_rows(positions, row_seq, block_tables)
    out = torch.empty_like(q) if out is None else _check_out(out, q)
    if num_rows == 0:
        return out
    select, select_ptr = _selection(only_rows, num_rows, keep_flagged=True, like=positions)
    rows_per_tile = block_m // groups if rows_per_tile is None else rows_per_tile
    if tiles is not None:
        if tiles.dtype != torch.int64 or tiles.dim() != 1 or tiles.numel() < 2 or tiles.device != q.device:
            raise ValueError(f"tiles must be a 1-D int64 tensor of at least 2 entries on {q.device}, got "
                             f"{tuple(tiles.shape)} {tiles.dtype} on {tiles.device}")
        num_tiles = tiles.numel() - 1
    else:
        num_tiles = -(-num_rows // rows_per_tile)
    k_src, v_src = _kv_sources(k_cache, v_cache, block_size=block_size, block_n=block_n, kv_tma=kv_tma)
    _tiled_attention_kernel[(num_tiles, num_kv_heads)](
        q, k_src, v_src, out, positions, row_seq, block_tables, select_ptr,
        positions if tiles is None else tiles, num_rows, num_tiles,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1), block_tables.stride(0),
        scale * _LOG2E, window,
        GROUPS=groups, HEAD_DIM=head_dim, BLOCK_D=max(16, triton.next_power_of_2(head_dim)), BLOCK_M=block_m,
        BLOCK_N=block_n, PAGE=block_size, HAS_WINDOW=has_window, DOT_PRECISION=_dot_precision(k_cache.dtype),
        IS_CANONICAL=is_canonical, UPCAST=q.device.type != "cuda", ROWS=rows_per_tile,
        MASK_EVERY_BLOCK=(is_canonical and CANONICAL_MASK_EVERY_BLOCK) if mask_every_block is None
        else mask_every_block, SELECT=select, TILE_TABLE=tiles is not None, KV_TMA=k_src is not k_cache,
        PREFETCH=num_warps >= PREFETCH_MIN_WARPS, num_warps=num_warps,
        num_stages=num_stages, enable_fp_fusion=(not is_canonical) if fp_fusion is None else fp_fusion,
    )
    return out


def kv_tma_fits(k_cache: torch.Tensor, *, block_size: int, block_n: int) -> str | None:
    """Why K/V of this cache cannot come through TMA descriptors in key blocks of ``block_n`` (None: they can).

    A key block must lie in one page (``block_size % block_n == 0``), the head dimension be a power of two of at
    least 16 elements and 16 bytes (one box spans it), the cache contiguous with 16-byte aligned rows.
    """
    num_slots, num_kv_heads, head_dim = k_cache.shape
    if block_size % block_n:
        return f"a key block of {block_n} keys spans pages of {block_size} (block_size must be a multiple of it)"
    if head_dim < 16 or head_dim & (head_dim - 1) or head_dim * k_cache.element_size() < 16:
        return f"head_dim {head_dim} is not a power of two of at least 16 elements and 16 bytes"
    if not k_cache.is_contiguous() or k_cache.data_ptr() % 16 or (num_kv_heads * head_dim * k_cache.element_size()) % 16:
        return "the cache is not contiguous with 16-byte aligned rows"
    if num_slots * num_kv_heads * head_dim >= 2 ** 31:
        return "the cache has more than 2**31 elements (TMA coordinates are 32-bit)"
    return None


@functools.lru_cache(maxsize=None)
def _capability(device_index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device_index)


def _hopper(device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    return _capability(device.index if device.index is not None else torch.cuda.current_device())[0] >= 9


def _kv_sources(k_cache: torch.Tensor, v_cache: torch.Tensor, *, block_size: int, block_n: int,
                kv_tma: bool | None):
    """What the kernel reads K/V through: the caches themselves (pointer gathers) or TMA descriptors.

    ``kv_tma``: None takes descriptors on a Hopper-or-newer GPU where :func:`kv_tma_fits`, True requires them
    (ValueError naming why not; Triton's interpreter runs them on the CPU), False never. The values loaded and
    the arithmetic on them are the same either way: a row's bits do not depend on it.
    """
    if kv_tma is False:
        return k_cache, v_cache
    why_not = kv_tma_fits(k_cache, block_size=block_size, block_n=block_n) or (
        None if v_cache.is_contiguous() and v_cache.data_ptr() % 16 == 0 else "the V cache is not contiguous")
    if kv_tma is None and (why_not or not _hopper(k_cache.device)):
        return k_cache, v_cache
    if why_not:
        raise ValueError(f"kv_tma: K/V cannot come through TMA descriptors here: {why_not}")
    from triton.tools.tensor_descriptor import TensorDescriptor

    num_slots, num_kv_heads, head_dim = k_cache.shape
    return tuple(TensorDescriptor.from_tensor(cache.view(num_slots, num_kv_heads * head_dim), [block_n, head_dim])
                 for cache in (k_cache, v_cache))


def prefill_config(num_rows: int, groups: int) -> tuple[int, int, int, int]:
    """The fast path's (block_m, block_n, warps, stages) for ``num_rows`` query rows of group size ``groups``."""
    config = PREFILL_LARGE if num_rows * groups >= PREFILL_LARGE_MIN_M_ROWS else PREFILL_SMALL
    if config[0] < groups:  # more query heads per kv head than M-rows: one query row per tile at least
        config = (triton.next_power_of_2(groups),) + config[1:]
    return config


def tiled_prefill_attention(
    q: torch.Tensor,  # [N, Hq, D]
    k_cache: torch.Tensor,  # [num_slots, Hkv, D]
    v_cache: torch.Tensor,  # [num_slots, Hkv, D]
    positions: torch.Tensor,  # [N] int64: each row sees keys [0, position] (or its window)
    row_seq: torch.Tensor,  # [N] int64: the block-table row of each query row; equal values = one sequence
    block_tables: torch.Tensor,  # [S, max_blocks] int64
    *,
    block_size: int,
    scale: float,
    sliding_window: int | None = None,
    config: tuple[int, int, int, int] | None = None,
    kv_tma: bool | None = None,
) -> torch.Tensor:
    """Fast tiled attention for prompt chunks (and any rows); returns [N, Hq, D].

    ``config`` (block_m, block_n, warps, stages) defaults to :func:`prefill_config`. ``kv_tma``: how K/V are read
    (None: TMA descriptors where the GPU and the page size allow, see :func:`kv_tma_fits`).
    """
    groups = q.shape[1] // max(k_cache.shape[1], 1)
    block_m, block_n, num_warps, num_stages = config or prefill_config(q.shape[0], groups)
    return _launch(q, k_cache, v_cache, positions, row_seq, block_tables, block_size=block_size, scale=scale,
                   sliding_window=sliding_window, block_m=block_m, block_n=block_n, num_warps=num_warps,
                   num_stages=num_stages, is_canonical=False, kv_tma=kv_tma)


def _check_canonical_groups(q: torch.Tensor, k_cache: torch.Tensor, tile_m: int) -> None:
    check_tile_m("the canonical tiled kernel", "tile_m", tile_m)
    groups = q.shape[1] // max(k_cache.shape[1], 1)
    if groups > tile_m:
        raise ValueError(f"the canonical tiled kernel takes at most {tile_m} query heads per kv head, got {groups}")


def tiled_canonical_attention(
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
    sliding_window: int | None = None,
    mask_every_block: bool | None = None,
    tiles: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    tile_m: int = CANONICAL_TILE_M,
    kv_tma: bool | None = None,
) -> torch.Tensor:
    """Canonical tiled attention: one fixed launch configuration, each row's bits its own; returns [N, Hq, D].

    ``kv_tma``: how K/V are read, not part of the canonical config (the same values, the same arithmetic): None
    takes TMA descriptors where the GPU and the page size allow (pages a multiple of ``key_block``).

    ``tile_m``: the tile height in M-rows (``llm42.engine.config.CANONICAL_TILE_HEIGHTS``), part of the canonical
    config like ``key_block``; warps, stages and the rest of the launch are fixed.

    ``mask_every_block``: None is the canonical config's ``CANONICAL_MASK_EVERY_BLOCK``; the other
    value is for the tests and the sweep that compare the two.

    ``tiles`` (optional, [T + 1] int64): which rows each program takes, tile t the rows
    [tiles[t], tiles[t + 1]), at most ``canonical_rows_per_tile`` of them; entries past the last tile
    repeat the row count (empty tiles, whose programs exit). ``llm42.cuda_graphs.tile_starts`` cuts each run of one
    sequence's rows into its own tiles, so no program runs two groups one after the other (the
    fixed tiling's 21-row tiles put most of a pass's 32-row windows' ends in a tile with the next
    window: two key sweeps in turn). The bits are the same either way (a row's bits do not depend on
    its tile-mates); what changes is the longest chain of key blocks any program walks. ``out``: written in
    place (rows no tile holds are left as they were).
    """
    _check_canonical_groups(q, k_cache, tile_m)
    return _launch(q, k_cache, v_cache, positions, row_seq, block_tables, block_size=block_size, scale=scale,
                   sliding_window=sliding_window, block_m=tile_m, block_n=key_block,
                   num_warps=CANONICAL_TILE_WARPS, num_stages=CANONICAL_TILE_STAGES, is_canonical=True,
                   mask_every_block=mask_every_block, tiles=tiles, out=out, kv_tma=kv_tma)


def canonical_rows_per_tile(groups: int, tile_m: int = CANONICAL_TILE_M) -> int:
    """Query rows in one tile of the canonical launch of height ``tile_m``, for ``groups`` query heads per kv head."""
    return check_tile_m("canonical_rows_per_tile", "tile_m", tile_m) // groups


def tiled_canonical_decode_attention(
    q: torch.Tensor,  # [B, Hq, D]: one query row per sequence, at position context_lens[b] - 1
    k_cache: torch.Tensor,  # [num_slots, Hkv, D]
    v_cache: torch.Tensor,  # [num_slots, Hkv, D]
    block_tables: torch.Tensor,  # [B, max_blocks] int64
    context_lens: torch.Tensor,  # [B] int64, >= 1
    *,
    block_size: int,
    scale: float,
    key_block: int = 64,
    sliding_window: int | None = None,
    mask_every_block: bool | None = None,
    only_rows: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    tile_m: int = CANONICAL_TILE_M,
) -> torch.Tensor:
    """Decode rows with the canonical tiled kernel's bits, one row per tile (the fast path's option); [B, Hq, D].

    ``tile_m``: the canonical config's tile height (the canonical pass's ``FixedShapePolicy(tile_m=)``).

    ``only_rows`` ([B], nonzero = compute): only those rows are computed and stored, the others' rows of
    ``out`` (written in place when given) are left as they were: a decode batch whose deterministic rows
    take these bits and the others the split-KV kernel's (``FastPolicy(decode_kernel="deterministic")``).

    The canonical launch packs ``tile_m // G`` rows per tile, so decode
    rows of different sequences share a program and run one after the other.
    Here each tile holds one row (one program per row and kv head, as the split-KV
    decode kernel with one split); everything else is the canonical launch's — the
    same tile height, key blocks, warps, stages and no FMA contraction. A
    row's bits do not depend on its tile-mates (the canonical kernel's
    property), so each row gets exactly the bits the canonical pass computes for
    it: a fast decode step that uses this agrees with the canonical pass on
    attention, and only the other ops' drift can make it roll back.
    """
    _check_canonical_groups(q, k_cache, tile_m)
    num_seqs = q.shape[0]
    positions = context_lens - 1
    row_seq = torch.arange(num_seqs, device=q.device)
    return _launch(q, k_cache, v_cache, positions, row_seq, block_tables, block_size=block_size, scale=scale,
                   sliding_window=sliding_window, block_m=tile_m, block_n=key_block,
                   num_warps=CANONICAL_TILE_WARPS, num_stages=CANONICAL_TILE_STAGES, is_canonical=True,
                   rows_per_tile=1, mask_every_block=mask_every_block, only_rows=only_rows, out=out)
