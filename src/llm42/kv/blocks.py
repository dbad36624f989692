"""Block accounting, and ``KVStore``: the default store composing it with the prefix index and the tensors.

The accounting owns the free list, reference counts, reservations, per-request
block tables and canonical marks. It follows the paired-verb style:
``can_allocate`` / ``allocate`` reserve a request's worst case up front (so an
admitted request can never run out of blocks mid-generation and nothing needs
pre-empting), ``append`` takes physical blocks lazily as positions are written,
``truncate`` gives back the blocks of a rolled-back tail, ``free`` returns
everything.

A request's K/V at positions ``[0, num_canonical(rid))`` was written by the
canonical pass; a block is canonical when all of its positions are. Full
canonical blocks are what ``publish`` hands to the prefix index
(``kv/prefix.py``), and what ``match_prefix`` offers later requests: sharing
them is exact because canonical K/V at position p is a function of
tokens[0..p] alone (invariant 3). A shared block is reference-counted; an
indexed block nobody holds stays cached until a fresh block is needed. The K/V
themselves live in ``kv/tensors.py``.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol, Sequence, runtime_checkable

import torch

from llm42.engine.config import positive_int, strict_bool
from llm42.kv.prefix import PrefixIndex
from llm42.kv.tensors import KVTensors
from llm42.model.config import ModelConfig
from llm42.model.forward import KVLayers


@runtime_checkable
class KVStoreProtocol(Protocol):
    """What the engine calls on a K/V store (an injected ``kv_store=`` must provide all of it).

    Optional, found with ``getattr``: ``drop_prefix_cache()`` (needed by ``update_weights``) and
    ``num_used_blocks`` / ``num_cached_blocks`` (reported by ``AsyncEngine`` metrics).
    """

    block_size: int  # positions per block
    num_blocks: int  # real blocks (capacity = num_blocks * block_size positions)
    scratch_block: int  # pads block tables; never a real block

    def can_allocate(self, max_tokens: int, prefix_blocks: Sequence[int] = ()) -> bool:
        """Whether ``allocate`` would succeed now."""
    def allocate(self, rid: int, max_tokens: int, prefix_blocks: Sequence[int] = ()) -> None:
        """Reserve ``rid``'s worst case, starting from the shared ``prefix_blocks``."""
    def append(self, rid: int, num_tokens: int) -> None:
        """Make positions ``[0, num_tokens)`` of ``rid`` addressable."""
    def truncate(self, rid: int, num_tokens: int) -> None:
        """Roll ``rid`` back to its first ``num_tokens`` positions."""
    def mark_canonical(self, rid: int, num_tokens: int) -> None:
        """Positions ``[0, num_tokens)`` of ``rid`` now hold canonical K/V."""
    def free(self, rid: int) -> None:
        """Release everything ``rid`` holds."""
    def match_prefix(self, tokens: Sequence[int]) -> list[int]:
        """Shareable blocks holding canonical K/V for the longest block-aligned prefix of ``tokens``."""
    def publish(self, rid: int, tokens: Sequence[int]) -> None:
        """Offer ``rid``'s full canonical blocks (``tokens`` from position 0) to later ``match_prefix`` calls."""
    def slots(self, rid: int, start: int, end: int) -> list[int]:
        """The K/V slot of each position in ``[start, end)`` of ``rid``."""
    def block_table(self, rid: int) -> list[int]:
        """``rid``'s blocks, first position first."""
    def scratch_slot(self, index: int) -> int:
        """The slot dummy row ``index`` writes to (no block table points there)."""
    def layers(self) -> KVLayers:
        """The K/V tensors as the model's ``forward`` takes them."""


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
        self.enable_prefix_cache = enable_prefix_cache
        self._tensors = KVTensors(cfg, num_blocks=num_blocks, block_size=block_size,
                                  num_scratch_slots=num_scratch_slots, dtype=dtype, device=device)
        self.scratch_block = self._tensors.scratch_block
        self.num_scratch_slots = self._tensors.num_scratch_slots
        self._prefix = PrefixIndex(block_size)
        self._free: deque[int] = deque(range(num_blocks))
        self._refs = [0] * num_blocks
        self._tables: dict[int, list[int]] = {}
        self._reserved: dict[int, int] = {}  # rid -> fresh blocks it may still take
        self._lengths: dict[int, int] = {}
        self._canonical: dict[int, int] = {}
        self._published: dict[int, int] = {}  # rid -> leading blocks already indexed

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
        return self._prefix.num_cached

    @property
    def num_used_blocks(self) -> int:
        """Blocks held by at least one request (a shared block counts once)."""
        return sum(1 for r in self._refs if r > 0)

    @property
    def num_unreserved_blocks(self) -> int:
        """Blocks a newly admitted request could still take."""
        return len(self._free) + self._prefix.num_cached - sum(self._reserved.values())

    def can_allocate(self, max_tokens: int, prefix_blocks: Sequence[int] = ()) -> bool:
        revived = sum(1 for b in prefix_blocks if self._prefix.is_cached(b))  # leave the pool when shared
        fresh = self._blocks_for(max_tokens) - len(prefix_blocks)
        return fresh + revived <= self.num_unreserved_blocks

    def allocate(self, rid: int, max_tokens: int, prefix_blocks: Sequence[int] = ()) -> None:
        """Admit ``rid``: reserve its worst case, sharing ``prefix_blocks`` (from match_prefix)."""
        if rid in self._tables:
            raise ValueError(f"request {rid} already holds K/V blocks")
        if not self.can_allocate(max_tokens, prefix_blocks):
            raise RuntimeError(f"KV store cannot reserve {max_tokens} tokens for request {rid}")
        for block in prefix_blocks:
            self._prefix.hold(block)
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
            block, freed = self._prefix.evict()
            self._free.extend(freed)
        self._refs[block] = 1
        return block

    def _release_block(self, block: int) -> None:
        self._refs[block] -= 1
        if self._refs[block] == 0 and not self._prefix.release(block):
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

    # -- prefix cache -----------------------------------------------------------------------
    def match_prefix(self, tokens: Sequence[int]) -> list[int]:
        """Indexed blocks holding canonical K/V for the longest block-aligned prefix of ``tokens``."""
        return self._prefix.match(tokens) if self.enable_prefix_cache else []

    def publish(self, rid: int, tokens: Sequence[int]) -> None:
        """Index ``rid``'s full canonical blocks; ``tokens`` are its tokens from position 0."""
        if not self.enable_prefix_cache:
            return
        num_full = min(self._canonical[rid], len(tokens)) // self.block_size
        self._published[rid] = self._prefix.publish(self._tables[rid], tokens,
                                                    num_published=self._published[rid], num_full=num_full)

    def drop_prefix_cache(self) -> None:
        """Forget every indexed prefix (after a weight update its K/V is stale): cached blocks become free.

        Blocks held by requests stay theirs; they are no longer offered to newcomers, and ``publish``
        stops a request's chain at its first block whose parent is no longer indexed.
        """
        self._free.extend(self._prefix.clear())

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
        return self._tensors.scratch_slot(index)

    def release(self) -> None:
        """Drop the K/V tensors, whoever still holds this store (``DVRGenerator.close`` of the generator that made
        it: a reference cycle through its verifier or fast path, e.g. a wrapper a caller installed, would otherwise
        keep the K/V on the device until the garbage collector ran). The store holds no K/V after (idempotent)."""
        self._tensors.release()

    def layers(self) -> KVLayers:
        return self._tensors.layers()
