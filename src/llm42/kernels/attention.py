"""Triton paged attention over the flat cache ``[num_slots, Hkv, D]`` (slot of position p =
``block_table[p // block_size] * block_size + p % block_size``).

Two kernels, one inner step:

- ``paged_decode_attention`` (fast path): one query row per sequence, the
  context cut into ``num_splits`` chunks processed in parallel
  (flash-decoding), then a combine kernel merges the partial softmaxes. The
  split count follows the batch and context, so results drift with them.
- ``canonical_attention`` (canonical pass): one program per (row, kv head),
  one KV split, key blocks of ``key_block`` positions aligned at absolute
  position 0, visited in order with an online softmax. A row's result depends
  on its own query, position and keys only: not on the other rows, where it
  sits, or how long anyone else's context is. It reads no host-side maximum
  context length, so one compiled launch serves every pass (and a CUDA graph).

A program handles all query heads that share one kv head (GQA), padded to 16
rows for ``tl.dot``; padded rows hold zeros and are never stored.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

_LOG2E = 1.4426950408889634
MAX_SPLITS = 32
# launch configuration (measured on an H200: benchmarks/gpu_bench.py). The canonical kernel's
# warps/stages are part of its reduction schedule: changing them changes committed bits.
DECODE_BLOCK_N = 64
DECODE_WARPS = 4
DECODE_STAGES = 3
# programs the split-KV decode kernel aims for, in waves over the SMs. Measured inside CUDA graphs on the
# H200 (benchmarks/device/decode_splits_sweep.py, benchmarks/results/h200_round7/decode_splits_sweep_graphs.json):
# over 30 shapes (SmolLM2's 3 and Llama-8B's 8 kv heads, batches 16..1,024, ShareGPT-like and 4K contexts)
# 6 waves came within 1.036x of each shape's best split count on average (worst 1.20x), 2 waves within
# 1.098x (worst 1.47x: SmolLM2 at batch 96, one split where 3-4 halve the time).
DECODE_SPLIT_WAVES = 6
# The decode launch's program order (the bits do not depend on it): a sequence's (kv head, split) programs next to
# each other (DECODE_HEAD_MAJOR), and the fast path passing ``StepInputs.decode_order``, the longest contexts first
# (DECODE_LONGEST_FIRST). Both on since round 49 (one H100, benchmarks/results/h100_round49/): the 8B shape's
# offline nondet at 1,024 sequences 11,511-11,525 tok/s against 11,076-11,092 with the old grid (1.04x, ABBA in
# two processes), SmolLM2's nondet / dvr@10 / dvr@50 1.027x / 1.056x / 1.028x (one run each), the same committed
# bits; dvr_ab.py's order_* variants set them per run (order_seq: the grid before round 48).
DECODE_HEAD_MAJOR = True
DECODE_LONGEST_FIRST = True
# the orders by name, as the benchmarks set them: (DECODE_HEAD_MAJOR, DECODE_LONGEST_FIRST)
DECODE_ORDERS = {"seq": (False, False), "head": (True, False), "head_longest": (True, True)}
# ... except that a batch whose (sequence, kv head) programs alone fill this many waves keeps one split, as
# under the old target (the same bits in large decode batches, the ones whose agreement with the canonical
# pass round 4 measured; the sweep: one split there is within 1.03x of the best, this rule 1.040x on average)
SINGLE_SPLIT_WAVES = 4
CANONICAL_WARPS = 4
CANONICAL_STAGES = 2


@triton.jit
def _attend_key_block(acc, m_i, l_i, q, k_head_ptr, v_head_ptr, table_row_ptr, key_start, lo, hi, qk_scale,
                      stride_k_slot, stride_v_slot, offs_d, d_mask,
                      PAGE: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr):
    # One online-softmax step over keys [key_start, key_start + BLOCK_N), of which [lo, hi) are visible.
    # The caller guarantees at least one visible key, so m_new is finite.
    key_pos = key_start + tl.arange(0, BLOCK_N)
    visible = (key_pos >= lo) & (key_pos < hi)
    page = tl.load(table_row_ptr + key_pos // PAGE, mask=visible, other=0)
    slot = page * PAGE + key_pos % PAGE
    kv_mask = visible[:, None] & d_mask[None, :]
    k = tl.load(k_head_ptr + slot[:, None] * stride_k_slot + offs_d[None, :], mask=kv_mask, other=0.0)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [G, N], log2 domain
    s = tl.where(visible[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    # masked values load as 0, so unwritten slots (even NaN garbage) never reach the sum
    v = tl.load(v_head_ptr + slot[:, None] * stride_v_slot + offs_d[None, :], mask=kv_mask, other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return acc, m_new, l_i


@triton.jit
def _canonical_attention_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, pos_ptr, row_seq_ptr, tables_ptr,
    stride_q_row, stride_q_head, stride_o_row, stride_o_head,
    stride_k_slot, stride_k_head, stride_v_slot, stride_v_head, stride_table,
    qk_scale, window,
    GROUPS: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr, PAGE: tl.constexpr, HAS_WINDOW: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    pos = tl.load(pos_ptr + row)
    seq = tl.load(row_seq_ptr + row)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    g_mask = offs_g < GROUPS
    d_mask = offs_d < HEAD_DIM
    heads = kv_head * GROUPS + offs_g
    q_mask = g_mask[:, None] & d_mask[None, :]
    q = tl.load(q_ptr + row * stride_q_row + heads[:, None] * stride_q_head + offs_d[None, :], mask=q_mask, other=0.0)

    hi = pos + 1
    if HAS_WINDOW:
        lo = tl.maximum(hi - window, 0)
    else:
        lo = hi * 0
    table_row_ptr = tables_ptr + seq * stride_table
    k_head_ptr = k_ptr + kv_head * stride_k_head
    v_head_ptr = v_ptr + kv_head * stride_v_head
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    # key blocks aligned at absolute position 0, in order; the range depends on this row alone
    for key_start in range((lo // BLOCK_N) * BLOCK_N, hi, BLOCK_N):
        acc, m_i, l_i = _attend_key_block(
            acc, m_i, l_i, q, k_head_ptr, v_head_ptr, table_row_ptr, key_start, lo, hi, qk_scale,
            stride_k_slot, stride_v_slot, offs_d, d_mask, PAGE, BLOCK_N, DOT_PRECISION,
        )
    out = acc / l_i[:, None]
    tl.store(out_ptr + row * stride_o_row + heads[:, None] * stride_o_head + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=q_mask)


@triton.jit
def _decode_partial_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, part_ptr, lse_ptr, tables_ptr, ctx_ptr, select_ptr, order_ptr,
    stride_q_row, stride_q_head, stride_o_row, stride_o_head,
    stride_k_slot, stride_k_head, stride_v_slot, stride_v_head, stride_table,
    stride_p_row, stride_p_head, stride_p_split, stride_l_row, stride_l_head,
    qk_scale, window, num_splits,
    GROUPS: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr, PAGE: tl.constexpr, HAS_WINDOW: tl.constexpr, IS_DIRECT: tl.constexpr,
    DOT_PRECISION: tl.constexpr, SELECT: tl.constexpr, HEAD_MAJOR: tl.constexpr, ORDERED: tl.constexpr,
):
    # Where a program sits in the grid only decides when it runs, never what it computes: HEAD_MAJOR puts a
    # sequence's kv heads and splits side by side in the launch order (they read neighbouring bytes of the same
    # slots), ORDERED dispatches the sequences in order_ptr's order (longest context first: no long program
    # left running alone at the end of the launch)
    if HEAD_MAJOR:
        kv_head = tl.program_id(0)
        split = tl.program_id(1)
        rank = tl.program_id(2)
    else:
        rank = tl.program_id(0)
        kv_head = tl.program_id(1)
        split = tl.program_id(2)
    if ORDERED:
        seq = tl.load(order_ptr + rank)
    else:
        seq = rank
    ctx = tl.load(ctx_ptr + seq)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    g_mask = offs_g < GROUPS
    d_mask = offs_d < HEAD_DIM
    if SELECT != 0:  # only the rows whose flag is 0 (SELECT 1) or nonzero (SELECT 2): the others read no key
        flag = tl.load(select_ptr + seq)
        keep = (flag != 0) if SELECT == 2 else (flag == 0)
        ctx = tl.where(keep, ctx, 0)
        g_mask = tl.where(keep, g_mask, False)  # (a scalar & a vector: Triton's interpreter gives int8, not a mask)
    heads = kv_head * GROUPS + offs_g
    q_mask = g_mask[:, None] & d_mask[None, :]
    q = tl.load(q_ptr + seq * stride_q_row + heads[:, None] * stride_q_head + offs_d[None, :], mask=q_mask, other=0.0)

    if HAS_WINDOW:
        lo = tl.maximum(ctx - window, 0)
    else:
        lo = ctx * 0
    # this split's chunk of [lo, ctx): chunks are whole key blocks; split 0 is never empty
    chunk = tl.cdiv(tl.cdiv(ctx - lo, num_splits), BLOCK_N) * BLOCK_N
    start = lo + split * chunk
    end = tl.minimum(start + chunk, ctx)
    table_row_ptr = tables_ptr + seq * stride_table
    k_head_ptr = k_ptr + kv_head * stride_k_head
    v_head_ptr = v_ptr + kv_head * stride_v_head
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for key_start in range(start, end, BLOCK_N):
        acc, m_i, l_i = _attend_key_block(
            acc, m_i, l_i, q, k_head_ptr, v_head_ptr, table_row_ptr, key_start, start, end, qk_scale,
            stride_k_slot, stride_v_slot, offs_d, d_mask, PAGE, BLOCK_N, DOT_PRECISION,
        )
    if IS_DIRECT:
        out = acc / l_i[:, None]
        tl.store(out_ptr + seq * stride_o_row + heads[:, None] * stride_o_head + offs_d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=q_mask)
    else:
        is_empty = l_i == 0.0
        part = acc / tl.where(is_empty, 1.0, l_i)[:, None]
        lse = tl.where(is_empty, float("-inf"), m_i + tl.log2(tl.where(is_empty, 1.0, l_i)))
        tl.store(part_ptr + seq * stride_p_row + heads[:, None] * stride_p_head + split * stride_p_split
                 + offs_d[None, :], part, mask=q_mask)
        tl.store(lse_ptr + seq * stride_l_row + heads * stride_l_head + split, lse, mask=g_mask)


@triton.jit
def _decode_combine_kernel(
    part_ptr, lse_ptr, out_ptr, select_ptr, num_splits,
    stride_p_row, stride_p_head, stride_p_split, stride_l_row, stride_l_head, stride_o_row, stride_o_head,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, SELECT: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_mask = offs_s < num_splits
    d_mask = offs_d < HEAD_DIM
    if SELECT != 0:
        flag = tl.load(select_ptr + seq)
        keep = (flag != 0) if SELECT == 2 else (flag == 0)
        s_mask = tl.where(keep, s_mask, False)
        d_mask = tl.where(keep, d_mask, False)
    lse = tl.load(lse_ptr + seq * stride_l_row + head * stride_l_head + offs_s, mask=s_mask, other=float("-inf"))
    weight = tl.exp2(lse - tl.max(lse, 0))  # empty and padded splits weigh exactly 0
    part = tl.load(part_ptr + seq * stride_p_row + head * stride_p_head + offs_s[:, None] * stride_p_split
                   + offs_d[None, :], mask=s_mask[:, None] & d_mask[None, :], other=0.0)
    out = tl.sum(weight[:, None] * part, 0) / tl.sum(weight, 0)
    tl.store(out_ptr + seq * stride_o_row + head * stride_o_head + offs_d, out.to(out_ptr.dtype.element_ty),
             mask=d_mask)


def _check_out(out: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    if out.shape != q.shape or out.dtype != q.dtype or out.device != q.device or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {q.dtype} tensor of q's shape {tuple(q.shape)} on {q.device}, "
                         f"got {out.dtype} {tuple(out.shape)} on {out.device}")
    return out


def _selection(flags: torch.Tensor | None, num_rows: int, *, keep_flagged: bool, like: torch.Tensor):
    """(SELECT, pointer) of a kernel's row selection: 0 and any tensor without ``flags``; else 2 (run the rows
    whose flag is nonzero) with ``keep_flagged``, 1 (run the rows whose flag is 0) without."""
    if flags is None:
        return 0, like
    if flags.shape != (num_rows,) or flags.device != like.device:
        raise ValueError(f"a row selection must be a [{num_rows}] tensor on {like.device}, "
                         f"got {tuple(flags.shape)} on {flags.device}")
    if flags.dtype == torch.bool:
        flags = flags.view(torch.int8)
    return (2 if keep_flagged else 1), flags.contiguous()


def _dot_precision(dtype: torch.dtype) -> str:
    # float32 caches get full-precision dots; 16-bit inputs use the tensor cores as they are
    return "ieee" if dtype == torch.float32 else "tf32"


def _check_shapes(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[int, int, int]:
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[1]
    if k_cache.shape != v_cache.shape or k_cache.shape[2] != head_dim or num_heads % num_kv_heads:
        raise ValueError(f"attention shapes do not fit: q {tuple(q.shape)}, k {tuple(k_cache.shape)}, "
                         f"v {tuple(v_cache.shape)}")
    if q.stride(2) != 1 or k_cache.stride(2) != 1 or v_cache.stride(2) != 1:
        raise ValueError("attention kernels need the head dimension contiguous")
    return num_heads, num_kv_heads, head_dim


def _contiguous_rows(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    # index vectors and block-table rows are read with unit stride
    return tuple(t if t.stride(-1) == 1 else t.contiguous() for t in tensors)


def _window(sliding_window: int | None) -> tuple[bool, int]:
    return (sliding_window is not None), (0 if sliding_window is None else int(sliding_window))


@functools.lru_cache(maxsize=None)
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def num_sms(device: torch.device) -> int:
    """Multiprocessors of ``device`` (132 on an H200; 132 assumed off-GPU, e.g. under the Triton interpreter)."""
    if device.type != "cuda":
        return 132
    return _num_sms(device.index if device.index is not None else torch.cuda.current_device())


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_context_len: int, *, num_sms: int,
                      block_n: int = 64, waves: int | None = None) -> int:
    """KV splits for a decode step: programs for ``waves`` (default ``DECODE_SPLIT_WAVES``) waves over the chip,
    at most one split per key block; one split where the batch alone fills ``SINGLE_SPLIT_WAVES`` waves."""
    num_key_blocks = -(-max(max_context_len, 1) // block_n)
    if waves is None:
        if num_seqs * num_kv_heads >= SINGLE_SPLIT_WAVES * num_sms:
            return 1
        waves = DECODE_SPLIT_WAVES
    wanted = -(-waves * num_sms // max(num_seqs * num_kv_heads, 1))
    return max(1, min(wanted, num_key_blocks, MAX_SPLITS))


def canonical_attention(
    q: torch.Tensor,  # [N, Hq, D]
    k_cache: torch.Tensor,  # [num_slots, Hkv, D]
    v_cache: torch.Tensor,  # [num_slots, Hkv, D]
    positions: torch.Tensor,  # [N] int64: each row's absolute position; it sees keys [0, position]
    row_seq: torch.Tensor,  # [N] int64: the block-table row of each query row
    block_tables: torch.Tensor,  # [S, max_blocks] int64
    *,
    block_size: int,
    scale: float,
    key_block: int = 64,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Canonical attention (one KV split, key blocks aligned at 0, rows independent); returns [N, Hq, D]."""
    if key_block < 16 or key_block & (key_block - 1):
        raise ValueError(f"the Triton canonical kernel needs key_block to be a power of two >= 16, got {key_block}")
    num_rows = q.shape[0]
    num_heads, num_kv_heads, head_dim = _check_shapes(q, k_cache, v_cache)
    groups = num_heads // num_kv_heads
    has_window, window = _window(sliding_window)
    positions, row_seq, block_tables = _contiguous_rows(positions, row_seq, block_tables)
    out = torch.empty_like(q)
    if num_rows == 0:
        return out
    _canonical_attention_kernel[(num_rows, num_kv_heads)](
        q, k_cache, v_cache, out, positions, row_seq, block_tables,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1), block_tables.stride(0),
        scale * _LOG2E, window,
        GROUPS=groups, BLOCK_G=max(16, triton.next_power_of_2(groups)), HEAD_DIM=head_dim,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)), BLOCK_N=key_block, PAGE=block_size,
        HAS_WINDOW=has_window, DOT_PRECISION=_dot_precision(k_cache.dtype),
        num_warps=CANONICAL_WARPS, num_stages=CANONICAL_STAGES,
    )
    return out


def paged_decode_attention(
    q: torch.Tensor,  # [B, Hq, D]: one query row per sequence, at position context_lens[b] - 1
    k_cache: torch.Tensor,  # [num_slots, Hkv, D]
    v_cache: torch.Tensor,  # [num_slots, Hkv, D]
    block_tables: torch.Tensor,  # [B, max_blocks] int64
    context_lens: torch.Tensor,  # [B] int64, >= 1
    *,
    block_size: int,
    scale: float,
    sliding_window: int | None = None,
    num_splits: int | None = None,
    max_context_len: int | None = None,
    skip_rows: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    order: torch.Tensor | None = None,
) -> torch.Tensor:
    """Fast split-KV decode attention; returns [B, Hq, D].

    ``num_splits`` defaults to :func:`choose_num_splits` over ``max_context_len``
    (a host bound on ``context_lens``; a CUDA graph passes its capacity). Each
    sequence cuts its own context into that many chunks on the device.
    ``skip_rows`` ([B], nonzero = skip): those rows read no key and their rows of the output are
    left as they were (``out``, when given, is written in place: another kernel fills the skipped
    rows); the other rows get the bits they get without it.
    ``order`` ([B] integers, a permutation of the sequences, e.g. ``StepInputs.decode_order``): the order in
    which the sequences' programs are dispatched; every row gets the bits it gets without it.
    """
    num_seqs = q.shape[0]
    num_heads, num_kv_heads, head_dim = _check_shapes(q, k_cache, v_cache)
    groups = num_heads // num_kv_heads
    has_window, window = _window(sliding_window)
    if num_splits is None:
        if max_context_len is None:
            raise ValueError("paged_decode_attention needs num_splits or max_context_len")
        num_splits = choose_num_splits(num_seqs, num_kv_heads, max_context_len, num_sms=num_sms(q.device),
                                       block_n=DECODE_BLOCK_N)
    if not 1 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"num_splits must be in [1, {MAX_SPLITS}], got {num_splits}")
    context_lens, block_tables = _contiguous_rows(context_lens, block_tables)
    out = torch.empty_like(q) if out is None else _check_out(out, q)
    if num_seqs == 0:
        return out
    select, select_ptr = _selection(skip_rows, num_seqs, keep_flagged=False, like=context_lens)
    if order is not None:
        if order.shape != (num_seqs,) or order.device != q.device or order.dtype.is_floating_point:
            raise ValueError(f"order must be a [{num_seqs}] integer tensor on {q.device}, "
                             f"got {order.dtype} {tuple(order.shape)} on {order.device}")
        order = order.contiguous()
    block_d = max(16, triton.next_power_of_2(head_dim))
    is_direct = num_splits == 1
    if is_direct:
        part = torch.empty((1, 1, 1, 1), device=q.device, dtype=torch.float32)
        lse = torch.empty((1, 1, 1), device=q.device, dtype=torch.float32)
    else:
        part = torch.empty((num_seqs, num_heads, num_splits, head_dim), device=q.device, dtype=torch.float32)
        lse = torch.empty((num_seqs, num_heads, num_splits), device=q.device, dtype=torch.float32)
    grid = (num_kv_heads, num_splits, num_seqs) if DECODE_HEAD_MAJOR else (num_seqs, num_kv_heads, num_splits)
    _decode_partial_kernel[grid](
        q, k_cache, v_cache, out, part, lse, block_tables, context_lens, select_ptr,
        context_lens if order is None else order,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1), block_tables.stride(0),
        part.stride(0), part.stride(1), part.stride(2), lse.stride(0), lse.stride(1),
        scale * _LOG2E, window, num_splits,
        GROUPS=groups, BLOCK_G=max(16, triton.next_power_of_2(groups)), HEAD_DIM=head_dim, BLOCK_D=block_d,
        BLOCK_N=DECODE_BLOCK_N, PAGE=block_size, HAS_WINDOW=has_window, IS_DIRECT=is_direct,
        DOT_PRECISION=_dot_precision(k_cache.dtype), SELECT=select, HEAD_MAJOR=DECODE_HEAD_MAJOR,
        ORDERED=order is not None, num_warps=DECODE_WARPS, num_stages=DECODE_STAGES,
    )
    if not is_direct:
        _decode_combine_kernel[(num_seqs, num_heads)](
            part, lse, out, select_ptr, num_splits,
            part.stride(0), part.stride(1), part.stride(2), lse.stride(0), lse.stride(1), out.stride(0),
            out.stride(1),
            HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_S=max(2, triton.next_power_of_2(num_splits)), SELECT=select,
            num_warps=4,
        )
    return out
