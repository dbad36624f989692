"""The per-step inputs of one forward pass: an explicit, frozen value.

The model never reads "the current batch" from anywhere else. A forward pass
processes N token rows in a flat (varlen) layout; rows belong to S sequences,
each with its own block table into the paged K/V store.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch


def longest_first(context_lens: torch.Tensor) -> torch.Tensor:
    """The sequences by context length, longest first ([S] int64 on ``context_lens``'s device; ties in sequence
    order): one sort on the device, no host sync."""
    return torch.sort(context_lens, descending=True, stable=True).indices


@dataclass(frozen=True)
class StepInputs:
    token_ids: torch.Tensor  # [N] int64
    positions: torch.Tensor  # [N] int64, absolute position of each row
    slot_mapping: torch.Tensor  # [N] int64, flat K/V slot each row writes
    row_seq: torch.Tensor  # [N] int64, which sequence (block-table row) each row belongs to
    block_tables: torch.Tensor  # [S, max_blocks] int64, physical block ids (scratch block where unused)
    context_lens: torch.Tensor  # [S] int64, number of keys visible to the last row of each sequence
    seq_starts: tuple[int, ...]  # S + 1 host offsets: rows of sequence s are [seq_starts[s], seq_starts[s+1])
    max_context_len: int  # host copy of context_lens.max()
    logits_rows: torch.Tensor | None = None  # [L] rows whose logits are wanted; None = every row
    # [N] int64 or None: the block-table row each row reads, one index per sequence (the layouts that give
    # every row its own copy of its sequence's table set it to the sequence's first row), so that a tiled
    # attention kernel knows which rows share keys; it must select the same table contents as row_seq.
    # None: row_seq already does (the varlen layout).
    table_rows: torch.Tensor | None = None
    # None, or the parts of a joined step (``join``): ((first row, the part's inputs), ...) covering the rows in
    # order; attention runs once per part on its own inputs (a decode batch beside staged prompt chunks)
    parts: tuple[tuple[int, StepInputs], ...] | None = None
    # None, or [N] int8 (decode rows only): 1 where the row is a deterministic request's, whose attention a fast
    # policy may give the canonical kernel's bits (``FastPolicy(decode_kernel="deterministic")``); 0 elsewhere
    deterministic_rows: torch.Tensor | None = None
    # None, or [T + 1] int64: the canonical tiled attention's tiles (``tiled_canonical_attention(tiles=)``), tile t
    # the rows [tiles[t], tiles[t + 1]) of one sequence; staged with a canonical pass (``StaticRows(tile_rows=)``)
    tiles: torch.Tensor | None = None

    @classmethod
    def join(cls, parts: list[StepInputs]) -> StepInputs:
        """One forward pass over the rows of ``parts`` in order; each part's rows attend as that part says.

        The row-wise fields are concatenated; the logits rows are each part's (all its rows where it wants
        every row's), offset by the part's first row. The sequence fields (``row_seq``, ``block_tables``,
        ``context_lens``, ``seq_starts``, ``table_rows``) are the parts' own: read through ``parts`` only.
        """
        starts, logits_rows, at = [], [], 0
        for part in parts:
            if part.parts is not None:
                raise ValueError("StepInputs.join: a part is itself joined")
            starts.append(at)
            rows = part.logits_rows
            if rows is None:
                rows = torch.arange(part.num_rows, device=part.token_ids.device)
            logits_rows.append(rows + at)
            at += part.num_rows
        first = parts[0]
        return cls(
            token_ids=torch.cat([p.token_ids for p in parts]),
            positions=torch.cat([p.positions for p in parts]),
            slot_mapping=torch.cat([p.slot_mapping for p in parts]),
            row_seq=first.row_seq,
            block_tables=first.block_tables,
            context_lens=first.context_lens,
            seq_starts=(0, at),
            max_context_len=max(p.max_context_len for p in parts),
            logits_rows=torch.cat(logits_rows),
            table_rows=None,
            parts=tuple(zip(starts, parts)),
            tiles=None,
        )

    @property
    def shared_table_rows(self) -> torch.Tensor:
        """Each row's block-table row, equal for the rows of one sequence (``table_rows``, else ``row_seq``)."""
        return self.row_seq if self.table_rows is None else self.table_rows

    @cached_property
    def decode_order(self) -> torch.Tensor:
        """``longest_first(context_lens)``: the order in which the fast decode attention dispatches the sequences.
        Computed on first use, once per step (inside a captured decode graph, once per replay)."""
        return longest_first(self.context_lens)

    @property
    def num_rows(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def num_seqs(self) -> int:
        return len(self.seq_starts) - 1

    @property
    def is_decode(self) -> bool:
        """One query row per sequence, in sequence order, each with its own table row: a decode step.

        Staged prompt chunks (fast prefill, the canonical pass) also give each row its own "sequence",
        but carry ``table_rows`` saying which rows share one: not decode.
        """
        return self.num_rows == self.num_seqs and self.table_rows is None and self.parts is None

    @property
    def max_query_len(self) -> int:
        return max(b - a for a, b in zip(self.seq_starts, self.seq_starts[1:]))
