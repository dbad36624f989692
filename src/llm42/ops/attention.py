"""Paged attention in plain PyTorch: a fast padded version and a fixed-schedule version.

Both read keys/values from a flat paged cache ``[num_slots, Hkv, D]`` where the
slot of position p of a sequence is ``block_table[p // block_size] * block_size
+ p % block_size``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from llm42.inputs import StepInputs
from llm42.ops import exact


def _slots(block_tables: torch.Tensor, key_pos: torch.Tensor, block_size: int) -> torch.Tensor:
    # block_tables: [S, MB]; key_pos: [K] -> slots [S, K]
    max_blocks = block_tables.shape[1]
    block_idx = torch.clamp(key_pos // block_size, max=max_blocks - 1)
    return block_tables[:, block_idx] * block_size + key_pos % block_size


def _visible(key_pos: torch.Tensor, query_pos: torch.Tensor, sliding_window: int | None) -> torch.Tensor:
    # key_pos: [K]; query_pos: [...] -> [..., K] causal (and windowed) visibility
    mask = key_pos <= query_pos[..., None]
    if sliding_window is not None:
        mask = mask & (key_pos > query_pos[..., None] - sliding_window)
    return mask


def padded_attention(
    q: torch.Tensor,  # [N, Hq, D]
    k_cache: torch.Tensor,  # [num_slots, Hkv, D]
    v_cache: torch.Tensor,  # [num_slots, Hkv, D]
    inputs: StepInputs,
    *,
    block_size: int,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Fast path: pad each sequence's queries and keys and call SDPA once. Shapes vary with the batch."""
    num_rows, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    num_seqs, max_q, max_k = inputs.num_seqs, inputs.max_query_len, inputs.max_context_len
    device = q.device

    starts = torch.tensor(inputs.seq_starts[:-1], device=device)
    row_offset = torch.arange(num_rows, device=device) - starts[inputs.row_seq]
    q_pad = q.new_zeros(num_seqs, max_q, num_heads, head_dim)
    q_pad[inputs.row_seq, row_offset] = q
    # padding query rows sit past every key; under a sliding window they may see no key at all, which
    # is harmless: they are dropped right after attention and rows never mix inside it
    qpos_pad = torch.full((num_seqs, max_q), max_k, device=device, dtype=torch.int64)
    qpos_pad[inputs.row_seq, row_offset] = inputs.positions

    key_pos = torch.arange(max_k, device=device)
    slots = _slots(inputs.block_tables, key_pos, block_size)  # [S, K]
    k = k_cache[slots]  # [S, K, Hkv, D]
    v = v_cache[slots]
    mask = _visible(key_pos, qpos_pad, sliding_window)  # [S, Q, K]
    mask = mask & (key_pos < inputs.context_lens[:, None, None])

    # GQA without copying K/V per query head: query head h reads kv head h // groups, so the query heads of
    # one kv head are stacked as extra query rows ([S, Hkv, groups * Q, D]) against that head's keys
    groups = num_heads // num_kv_heads
    q_grouped = q_pad.transpose(1, 2).reshape(num_seqs, num_kv_heads, groups * max_q, head_dim)
    mask = mask[:, None, None].expand(num_seqs, 1, groups, max_q, max_k).reshape(num_seqs, 1, groups * max_q, max_k)
    out = F.scaled_dot_product_attention(
        q_grouped, k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, scale=scale
    )  # [S, Hkv, groups * Q, D]
    out = out.reshape(num_seqs, num_heads, max_q, head_dim)
    return out.transpose(1, 2)[inputs.row_seq, row_offset]  # [N, Hq, D]


def blocked_attention(
    q: torch.Tensor,  # [N, Hq, D]
    k_cache: torch.Tensor,  # [num_slots, Hkv, D]
    v_cache: torch.Tensor,  # [num_slots, Hkv, D]
    inputs: StepInputs,
    *,
    block_size: int,
    scale: float,
    key_block: int,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Canonical attention: one KV split, key blocks of ``key_block`` aligned at position 0.

    Each row runs its own online softmax over key blocks 0, 1, 2, ... in order,
    and a block a row cannot see leaves its state bit-for-bit unchanged (scale
    exp(0) = 1, adds exact zeros). q·k and p·v accumulate exactly
    (``llm42.ops.exact``) and the softmax's exp and sums are exact too, so a
    row's output depends on its own query and keys only: never on how many rows
    there are, how long the other rows' contexts are, where the row sits, the
    memory layout, or the instruction set the library runs on.

    Each key and value vector is sliced on its own (over D), so once per slot
    however many rows read it. Rows that share a block table (``StepInputs.shared_table_rows``: a sequence's
    rows) share its keys, gathered once per sequence; a sequence's rows run q·k and p·v against them together,
    sequences with as many rows in one batched GEMM. Every element of those products is an exact integer sum,
    so how rows are batched cannot show in the bits. A value's unscale (a power of two) folds into p exactly.
    A value no row of the block can see is zeroed before slicing (stale or uninitialised memory), and -0 is made
    +0, so what a row cannot see cannot reach its bits.
    """
    num_rows, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    groups = num_heads // num_kv_heads
    device = q.device
    qk_row_bits, qk_column_bits = exact.slice_bits(head_dim)  # q·k contracts over D
    pv_row_bits, pv_column_bits = exact.slice_bits(key_block)  # p·v over a block's keys

    # the pass's sequences (rows with one block table); sequences with as many rows form a bucket, whose rows
    # (by sequence, then in order) run their products as one batched GEMM: no padding, a few GEMMs per block
    seq_tables, seq_of_row = torch.unique(inputs.shared_table_rows, return_inverse=True)  # [S], [N]
    rows_of: dict[int, list[int]] = {}
    for row, seq in enumerate(seq_of_row.tolist()):
        rows_of.setdefault(seq, []).append(row)
    by_count: dict[int, list[int]] = {}
    for seq, rows in rows_of.items():
        by_count.setdefault(len(rows), []).append(seq)
    buckets = [(torch.tensor([r for seq in seqs for r in rows_of[seq]], device=device),
                torch.tensor(seqs, device=device), len(seqs), count) for count, seqs in by_count.items()]
    # one bucket holding the rows in order (every sequence as many rows, rows by sequence): no gathers needed
    in_order = len(buckets) == 1 and [r for rows in rows_of.values() for r in rows] == list(range(num_rows)) \
        and list(rows_of) == list(range(len(rows_of)))
    tables = inputs.block_tables[seq_tables]  # [S, MB]
    is_row_per_seq = in_order and buckets[0][3] == 1  # sequence s is row s

    def per_row(t: torch.Tensor) -> torch.Tensor:  # [Hkv, S, ...] -> [Hkv, N, ...]: each row its sequence's
        return t if is_row_per_seq else t[:, seq_of_row]

    def per_sequence_product(stacked: torch.Tensor, b_ints: torch.Tensor) -> torch.Tensor:
        # stacked [Hkv, N, 3G, K] (a row's three slices), b_ints [Hkv, S, K, X] -> [Hkv, N, 3G, X]: each row's
        # products with its own sequence's columns
        if in_order:
            _, _, num_seqs, count = buckets[0]
            parts = torch.matmul(stacked.unflatten(1, (num_seqs, count)).flatten(2, 3), b_ints)
            return parts.unflatten(2, (count, -1)).flatten(1, 2)
        out = stacked.new_empty((*stacked.shape[:-1], b_ints.shape[-1]))
        for rows, seqs, num_seqs, count in buckets:
            a = stacked[:, rows].unflatten(1, (num_seqs, count)).flatten(2, 3)  # [Hkv, S_b, count * 3G, K]
            out[:, rows] = torch.matmul(a, b_ints[:, seqs]).unflatten(2, (count, -1)).flatten(1, 2)
        return out

    # head-major [Hkv, N, ...] throughout: the batched GEMMs then see contiguous batches
    qf = (q.float().reshape(num_rows, num_kv_heads, groups, head_dim) * scale).transpose(0, 1)  # [Hkv, N, G, D]
    q_stacked, q_unscale = exact.split_rows(qf, qk_row_bits)  # once for every key block
    m = torch.full((num_kv_heads, num_rows, groups, 1), float("-inf"), device=device)
    denom = torch.zeros((num_kv_heads, num_rows, groups), device=device)
    acc = torch.zeros((num_kv_heads, num_rows, groups, head_dim), device=device)
    num_key_blocks = -(-inputs.max_context_len // key_block)
    for j in range(num_key_blocks):
        key_pos = torch.arange(j * key_block, (j + 1) * key_block, device=device)
        slots = _slots(tables, key_pos, block_size)  # [S, KB]
        unique_slots, seq_slots = torch.unique(slots, return_inverse=True)  # [U], [S, KB]
        row_slots = seq_slots if is_row_per_seq else seq_slots[seq_of_row]  # [N, KB]
        visible = _visible(key_pos, inputs.positions, sliding_window)  # [N, KB]
        is_seen = torch.zeros(unique_slots.shape, dtype=torch.bool, device=device)
        is_seen[row_slots[visible]] = True
        values = v_cache[unique_slots].float()  # [U, Hkv, D]
        values[~is_seen] = 0.0
        # [Hkv, S, KB, D | 1]
        k_ints, k_unscale = _per_sequence_slices(k_cache[unique_slots], seq_slots, qk_column_bits)
        v_ints, v_unscale = _per_sequence_slices(values, seq_slots, pv_column_bits)

        s = exact.combine_parts(per_sequence_product(q_stacked, k_ints.transpose(-1, -2)), q_unscale, qk_row_bits)
        s = s.mul_(per_row(k_unscale.transpose(-1, -2))).float()  # [Hkv, N, G, KB]
        s = torch.where(visible[None, :, None, :], s, float("-inf"))
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        # a row that has seen no key yet (sliding window) keeps m = -inf; subtract 0 there, not -inf
        m_sub = torch.where(torch.isinf(m_new), 0.0, m_new)
        scaled = exact.exp(torch.cat([m, s], dim=-1) - m_sub)  # [Hkv, N, G, 1 + KB]: alpha, then p
        alpha, p = scaled[..., :1], scaled[..., 1:]
        denom = denom * alpha[..., 0] + exact.row_sum(p).float()
        p_stacked, p_unscale = exact.split_rows(p * per_row(v_unscale.transpose(-1, -2)), pv_row_bits)
        pv = exact.combine_parts(per_sequence_product(p_stacked, v_ints), p_unscale, pv_row_bits).add_(0.0)
        acc = acc * alpha + pv.float()  # pv: [Hkv, N, G, D]
        m = m_new
    out = acc / denom[..., None]
    return out.transpose(0, 1).reshape(num_rows, num_heads, head_dim).to(q.dtype)


def _per_sequence_slices(vectors: torch.Tensor, seq_slots: torch.Tensor, bits: int
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """``vectors`` [U, Hkv, X] sliced per vector, gathered for each sequence: (ints, unscale), [Hkv, S, KB, X | 1]."""
    head_major = (t.transpose(0, 1).contiguous() for t in exact.split_last(vectors, bits))  # [Hkv, U, X]
    return tuple(t.index_select(1, seq_slots.flatten()).unflatten(1, seq_slots.shape) for t in head_major)
