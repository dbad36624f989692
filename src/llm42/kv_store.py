"""Paged K/V storage: blocks, per-request block tables, a free list, canonical marks and a prefix index.

Accounting follows the paired-verb style: ``can_allocate`` / ``allocate``
reserve a request's worst case up front (so an admitted request can never run
out of blocks mid-generation and nothing needs pre-empting), ``append`` takes
physical blocks lazily as positions are written, ``truncate`` gives back the
blocks of a rolled-back tail, ``free`` returns everything.

A request's K/V at positions ``[0, num_canonical(rid))`` was written by the
canonical pass; a block is canonical when all of its positions are.

Prefix index. Canonical K/V at position p is a function of tokens[0..p] alone
(invariant 3), so a full canonical block can be shared by every later request
whose tokens agree up to the end of that block — across requests and across
turns — without changing a bit of anyone's output. ``publish`` indexes a
request's full canonical blocks by (parent block, the block's tokens);
``match_prefix`` finds the longest indexed chain for a new prompt. Shared
blocks are reference-counted; an indexed block nobody holds stays cached
(least recently released first out) until a fresh block is needed.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Protocol, Sequence, runtime_checkable

import torch

from llm42.engine.config import positive_int, strict_bool
from llm42.model.config import ModelConfig
from llm42.model.forward import KVLayers

_ROOT = -1  # parent id of a sequence's first block in the prefix index


@runtime_checkable
class KVStoreProtocol(Protocol):
    block_size: int
    num_blocks: int
    scratch_block: int

    def can_allocate(self, max_tokens: int, prefix_blocks: Sequence[int] = ()) -> bool: ...
    def allocate(self, rid: int, max_tokens: int, prefix_blocks: Sequence[int] = ()) -> None: ...
    def append(self, rid: int, num_tokens: int) -> None: ...
    def truncate(self, rid: int, num_tokens: int) -> None: ...
    def mark_canonical(self, rid: int, num_tokens: int) -> None: ...
    def free(self, rid: int) -> None: ...
    def match_prefix(self, tokens: Sequence[int]) -> list[int]: ...
    def publish(self, rid: int, tokens: Sequence[int]) -> None: ...
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
        enable_prefix_cache: bool = True,
    ):
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size),
                            ("num_scratch_slots", num_scratch_slots)):
            positive_int("KVStore", name, value)
        strict_bool("KVStore", "enable_prefix_cache", enable_prefix_cache)
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.scratch_block = num_blocks
        self.enable_prefix_cache = enable_prefix_cache
        num_scratch_blocks = -(-num_scratch_slots // block_size)
        self.num_scratch_slots = num_scratch_blocks * block_size
        num_slots = (num_blocks + num_scratch_blocks) * block_size
        shape = (num_slots, cfg.num_kv_heads, cfg.head_dim)
        self._k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_layers)]
        self._v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_layers)]
        self._free: deque[int] = deque(range(num_blocks))
        self._refs = [0] * num_blocks
        self._tables: dict[int, list[int]] = {}
        self._reserved: dict[int, int] = {}  # rid -> fresh blocks it may still take
        self._lengths: dict[int, int] = {}
        self._canonical: dict[int, int] = {}
        self._published: dict[int, int] = {}  # rid -> leading blocks already indexed
        # prefix index: (parent block or _ROOT, block tokens) -> block, and the reverse
        self._index: dict[tuple[int, tuple[int, ...]], int] = {}
        self._key_of: dict[int, tuple[int, tuple[int, ...]]] = {}
        self._children: dict[int, set[int]] = {}
        self._cached: OrderedDict[int, None] = OrderedDict()  # indexed blocks nobody holds (LRU first)

    # -- accounting -------------------------------------------------------------------------
    def _blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    @property
    def num_free_blocks(self) -> int:
        """Blocks on the free list (not counting cached prefix blocks nobody holds)."""
        return len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        """Indexed prefix blocks nobody holds: reusable, and evicted when fresh blocks are needed."""
        return len(self._cached)

    @property
    def num_used_blocks(self) -> int:
        """Blocks held by at least one request (a shared block counts once)."""
        return sum(1 for r in self._refs if r > 0)

    @property
    def num_unreserved_blocks(self) -> int:
        """Blocks a newly admitted request could still take."""
        return len(self._free) + len(self._cached) - sum(self._reserved.values())

    def can_allocate(self, max_tokens: int, prefix_blocks: Sequence[int] = ()) -> bool:
        revived = sum(1 for b in prefix_blocks if b in self._cached)  # leave the pool when shared
        fresh = self._blocks_for(max_tokens) - len(prefix_blocks)
        return fresh + revived <= self.num_unreserved_blocks

    def allocate(self, rid: int, max_tokens: int, prefix_blocks: Sequence[int] = ()) -> None:
        """Admit ``rid``: reserve its worst case, sharing ``prefix_blocks`` (from match_prefix)."""
        if rid in self._tables:
            raise ValueError(f"request {rid} already holds K/V blocks")
        if not self.can_allocate(max_tokens, prefix_blocks):
            raise RuntimeError(f"KV store cannot reserve {max_tokens} tokens for request {rid}")
        for block in prefix_blocks:
            self._cached.pop(block, None)
            self._refs[block] += 1
        num_shared = len(prefix_blocks) * self.block_size
        self._tables[rid] = list(prefix_blocks)
        self._reserved[rid] = self._blocks_for(max_tokens) - len(prefix_blocks)
        self._lengths[rid] = num_shared
        self._canonical[rid] = num_shared
        self._published[rid] = len(prefix_blocks)

    def _take_block(self) -> int:
        if self._free:
            block = self._free.popleft()
        else:
            block, _ = self._cached.popitem(last=False)
            self._unindex(block)
        self._refs[block] = 1
        return block

    def _release_block(self, block: int) -> None:
        self._refs[block] -= 1
        if self._refs[block] == 0:
            if block in self._key_of:
                self._cached[block] = None
            else:
                self._free.append(block)

    def append(self, rid: int, num_tokens: int) -> None:
        """Make positions [0, num_tokens) of ``rid`` addressable (they will be written this step)."""
        table = self._tables[rid]
        needed = self._blocks_for(num_tokens) - len(table)
        if needed > self._reserved[rid]:
            raise RuntimeError(f"request {rid} needs {needed} more blocks but has {self._reserved[rid]} reserved")
        for _ in range(needed):
            table.append(self._take_block())
        self._reserved[rid] -= max(needed, 0)
        self._lengths[rid] = max(self._lengths[rid], num_tokens)

    def truncate(self, rid: int, num_tokens: int) -> None:
        """Roll back to the first ``num_tokens`` positions; blocks past them return to the pool."""
        if num_tokens < self._published[rid] * self.block_size:
            raise ValueError(f"cannot truncate request {rid} into its shared prefix blocks")
        table = self._tables[rid]
        keep = self._blocks_for(num_tokens)
        while len(table) > keep:
            self._release_block(table.pop())
            self._reserved[rid] += 1
        self._lengths[rid] = min(self._lengths[rid], num_tokens)
        self._canonical[rid] = min(self._canonical[rid], num_tokens)

    def mark_canonical(self, rid: int, num_tokens: int) -> None:
        """Positions [0, num_tokens) of ``rid`` now hold K/V written by the canonical pass."""
        if num_tokens > self._lengths[rid]:
            raise ValueError(f"cannot mark {num_tokens} canonical positions of request {rid}: "
                             f"only {self._lengths[rid]} are written")
        self._canonical[rid] = num_tokens

    def free(self, rid: int) -> None:
        for block in reversed(self._tables.pop(rid)):  # children before parents: parents evicted last
            self._release_block(block)
        del self._reserved[rid], self._lengths[rid], self._canonical[rid], self._published[rid]

    # -- prefix index ----------------------------------------------------------------------
    def match_prefix(self, tokens: Sequence[int]) -> list[int]:
        """Indexed blocks holding canonical K/V for the longest block-aligned prefix of ``tokens``."""
        if not self.enable_prefix_cache:
            return []
        bs = self.block_size
        blocks: list[int] = []
        parent = _ROOT
        for i in range(len(tokens) // bs):
            block = self._index.get((parent, tuple(tokens[i * bs: (i + 1) * bs])))
            if block is None:
                break
            blocks.append(block)
            parent = block
        return blocks

    def publish(self, rid: int, tokens: Sequence[int]) -> None:
        """Index ``rid``'s full canonical blocks; ``tokens`` are its tokens from position 0."""
        if not self.enable_prefix_cache:
            return
        bs = self.block_size
        table = self._tables[rid]
        num_full = min(self._canonical[rid], len(tokens)) // bs
        for i in range(self._published[rid], num_full):
            parent = _ROOT if i == 0 else table[i - 1]
            if parent != _ROOT and parent not in self._key_of:
                break  # the parent holds the same content under another block: stop the chain here
            key = (parent, tuple(tokens[i * bs: (i + 1) * bs]))
            block = table[i]
            if key not in self._index and block not in self._key_of:
                self._index[key] = block
                self._key_of[block] = key
                self._children.setdefault(parent, set()).add(block)
            self._published[rid] = i + 1

    def drop_prefix_cache(self) -> None:
        """Forget every indexed prefix (after a weight update its K/V is stale): cached blocks become free.

        Blocks held by requests stay theirs; they are no longer offered to newcomers, and ``publish``
        stops a request's chain at its first block whose parent is no longer indexed.
        """
        self._free.extend(self._cached)
        self._cached.clear()
        self._index.clear()
        self._key_of.clear()
        self._children.clear()

    def _unindex(self, block: int) -> None:
        # a block leaving the index takes its descendants with it: their keys name it as parent
        key = self._key_of.pop(block)
        del self._index[key]
        self._children.get(key[0], set()).discard(block)
        for child in self._children.pop(block, set()):
            if child in self._key_of:
                self._unindex(child)
                if child in self._cached:  # nobody holds it: it is simply free now
                    del self._cached[child]
                    self._free.append(child)

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
