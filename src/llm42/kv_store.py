"""Paged K/V storage: blocks, per-request block tables, a free list, and canonical marks.

Accounting follows the paired-verb style: ``can_allocate`` / ``allocate``
reserve a request's worst case up front (so an admitted request can never run
out of blocks mid-generation and nothing needs pre-empting), ``append`` takes
physical blocks lazily as positions are written, ``truncate`` gives back the
blocks of a rolled-back tail, ``free`` returns everything.

A request's K/V at positions ``[0, num_canonical(rid))`` was written by the
canonical pass; a block is canonical when all of its positions are.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol, runtime_checkable

import torch

from llm42.model.config import ModelConfig
from llm42.model.forward import KVLayers


@runtime_checkable
class KVStoreProtocol(Protocol):
    block_size: int
    num_blocks: int
    scratch_block: int

    def can_allocate(self, max_tokens: int) -> bool: ...
    def allocate(self, rid: int, max_tokens: int) -> None: ...
    def append(self, rid: int, num_tokens: int) -> None: ...
    def truncate(self, rid: int, num_tokens: int) -> None: ...
    def mark_canonical(self, rid: int, num_tokens: int) -> None: ...
    def free(self, rid: int) -> None: ...
    def slots(self, rid: int, start: int, end: int) -> list[int]: ...
    def block_table(self, rid: int) -> list[int]: ...
    def num_tokens(self, rid: int) -> int: ...
    def num_canonical(self, rid: int) -> int: ...
    def scratch_slot(self, index: int) -> int: ...
    def layers(self) -> KVLayers: ...


class KVStore:
    """The default paged K/V store, one flat ``[slots, Hkv, D]`` tensor pair per layer.

    ``num_scratch_slots`` slots after the last real block take the K/V writes of
    dummy (padding) rows; no request's block table ever points there.
    """

    def __init__(
        self,
        cfg: ModelConfig,
        *,
        num_blocks: int,
        block_size: int = 16,
        num_scratch_slots: int = 256,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ):
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size),
                            ("num_scratch_slots", num_scratch_slots)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"KVStore {name} must be a positive integer, got {value!r}")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.scratch_block = num_blocks
        num_scratch_blocks = -(-num_scratch_slots // block_size)
        self.num_scratch_slots = num_scratch_blocks * block_size
        num_slots = (num_blocks + num_scratch_blocks) * block_size
        shape = (num_slots, cfg.num_kv_heads, cfg.head_dim)
        self._k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_layers)]
        self._v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_layers)]
        self._free: deque[int] = deque(range(num_blocks))
        self._tables: dict[int, list[int]] = {}
        self._reserved: dict[int, int] = {}  # rid -> blocks reserved for its worst case
        self._lengths: dict[int, int] = {}
        self._canonical: dict[int, int] = {}

    # -- accounting -------------------------------------------------------------------------
    def _blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return sum(len(t) for t in self._tables.values())

    @property
    def num_unreserved_blocks(self) -> int:
        """Blocks neither in use nor promised to an admitted request."""
        return self.num_blocks - sum(self._reserved.values())

    def can_allocate(self, max_tokens: int) -> bool:
        return self._blocks_for(max_tokens) <= self.num_unreserved_blocks

    def allocate(self, rid: int, max_tokens: int) -> None:
        if rid in self._tables:
            raise ValueError(f"request {rid} already holds K/V blocks")
        if not self.can_allocate(max_tokens):
            raise RuntimeError(f"KV store cannot reserve {max_tokens} tokens for request {rid}")
        self._tables[rid] = []
        self._reserved[rid] = self._blocks_for(max_tokens)
        self._lengths[rid] = 0
        self._canonical[rid] = 0

    def append(self, rid: int, num_tokens: int) -> None:
        """Make positions [0, num_tokens) of ``rid`` addressable (they will be written this step)."""
        table = self._tables[rid]
        needed = self._blocks_for(num_tokens)
        if needed > self._reserved[rid]:
            raise RuntimeError(f"request {rid} needs {needed} blocks but reserved {self._reserved[rid]}")
        while len(table) < needed:
            table.append(self._free.popleft())
        self._lengths[rid] = max(self._lengths[rid], num_tokens)

    def truncate(self, rid: int, num_tokens: int) -> None:
        """Roll back to the first ``num_tokens`` positions; blocks past them return to the free list."""
        table = self._tables[rid]
        keep = self._blocks_for(num_tokens)
        while len(table) > keep:
            self._free.append(table.pop())
        self._lengths[rid] = min(self._lengths[rid], num_tokens)
        self._canonical[rid] = min(self._canonical[rid], num_tokens)

    def mark_canonical(self, rid: int, num_tokens: int) -> None:
        """Positions [0, num_tokens) of ``rid`` now hold K/V written by the canonical pass."""
        if num_tokens > self._lengths[rid]:
            raise ValueError(f"cannot mark {num_tokens} canonical positions of request {rid}: "
                             f"only {self._lengths[rid]} are written")
        self._canonical[rid] = num_tokens

    def free(self, rid: int) -> None:
        table = self._tables.pop(rid)
        self._free.extend(table)
        del self._reserved[rid], self._lengths[rid], self._canonical[rid]

    # -- addressing -------------------------------------------------------------------------
    def slots(self, rid: int, start: int, end: int) -> list[int]:
        table = self._tables[rid]
        bs = self.block_size
        return [table[p // bs] * bs + p % bs for p in range(start, end)]

    def block_table(self, rid: int) -> list[int]:
        return list(self._tables[rid])

    def num_tokens(self, rid: int) -> int:
        return self._lengths[rid]

    def num_canonical(self, rid: int) -> int:
        return self._canonical[rid]

    def is_block_canonical(self, rid: int, index: int) -> bool:
        return (index + 1) * self.block_size <= self._canonical[rid]

    def holds(self, rid: int) -> bool:
        return rid in self._tables

    def scratch_slot(self, index: int) -> int:
        return self.scratch_block * self.block_size + index % self.num_scratch_slots

    def layers(self) -> KVLayers:
        return KVLayers(self._k, self._v, self.block_size)
