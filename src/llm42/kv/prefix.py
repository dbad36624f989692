"""The prefix index: which blocks hold canonical K/V for which token prefix, and which of them nobody holds.

Why sharing is exact: canonical K/V at position p is a function of tokens[0..p]
alone (invariant 3), so a full canonical block can serve every later request
whose tokens agree up to the end of that block — across requests and across
turns — without changing a bit of anyone's output.

A block is indexed under its key (parent block or ``ROOT``, the block's tokens),
so a key names a whole prefix, and ``match`` walks the chain from ``ROOT``.
An indexed block whose reference count drops to zero is *cached* rather than
freed (``release``); a cached block taken again by a request leaves the cache
(``hold``); when no free block is left, ``evict`` takes the least recently
released one. A block leaving the index takes its descendants with it (their
keys name it as parent).

Reference counts, the free list and tables are the block accounting's
(``kv/blocks.py``); this module only reports which blocks it gives back.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

ROOT = -1  # parent id of a sequence's first block

BlockKey = tuple[int, tuple[int, ...]]  # (parent block or ROOT, the block's tokens)


class PrefixIndex:
    """Full canonical blocks indexed by (parent, tokens), plus an LRU of the indexed blocks nobody holds."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self._index: dict[BlockKey, int] = {}
        self._key_of: dict[int, BlockKey] = {}
        self._children: dict[int, set[int]] = {}
        self._cached: OrderedDict[int, None] = OrderedDict()  # least recently released first

    @property
    def num_cached(self) -> int:
        """Indexed blocks nobody holds."""
        return len(self._cached)

    def is_cached(self, block: int) -> bool:
        return block in self._cached

    def match(self, tokens: Sequence[int]) -> list[int]:
        """Indexed blocks for the longest block-aligned prefix of ``tokens``, first block first."""
        bs = self.block_size
        blocks: list[int] = []
        parent = ROOT
        for i in range(len(tokens) // bs):
            block = self._index.get((parent, tuple(tokens[i * bs: (i + 1) * bs])))
            if block is None:
                break
            blocks.append(block)
            parent = block
        return blocks

    def publish(self, table: Sequence[int], tokens: Sequence[int], *, num_published: int, num_full: int) -> int:
        """Index blocks ``table[num_published:num_full]`` (full and canonical) holding ``tokens`` from position 0.

        Returns how many leading blocks of ``table`` are published now. A block whose key is already
        indexed under another block is skipped (the content is there already); the chain stops at a
        block whose parent is not indexed, since no key can name that parent.
        """
        bs = self.block_size
        for i in range(num_published, num_full):
            parent = ROOT if i == 0 else table[i - 1]
            if parent != ROOT and parent not in self._key_of:
                return i
            key = (parent, tuple(tokens[i * bs: (i + 1) * bs]))
            block = table[i]
            if key not in self._index and block not in self._key_of:
                self._index[key] = block
                self._key_of[block] = key
                self._children.setdefault(parent, set()).add(block)
        return max(num_published, num_full)

    def hold(self, block: int) -> None:
        """A request takes ``block`` (from ``match``): it is no longer evictable."""
        self._cached.pop(block, None)

    def release(self, block: int) -> bool:
        """Nobody holds ``block`` any more: keep it cached if indexed. Returns whether it was kept."""
        if block not in self._key_of:
            return False
        self._cached[block] = None
        return True

    def evict(self) -> tuple[int, list[int]]:
        """Take the least recently released cached block out of the index (needs ``num_cached > 0``).

        Returns it and the cached descendants that left the index with it, which are free now.
        """
        block, _ = self._cached.popitem(last=False)
        freed: list[int] = []
        self._unindex(block, freed)
        return block, freed

    def clear(self) -> list[int]:
        """Forget every indexed prefix; returns the cached blocks, free now (least recently released first)."""
        freed = list(self._cached)
        self._cached.clear()
        self._index.clear()
        self._key_of.clear()
        self._children.clear()
        return freed

    def _unindex(self, block: int, freed: list[int]) -> None:
        key = self._key_of.pop(block)
        del self._index[key]
        self._children.get(key[0], set()).discard(block)
        for child in self._children.pop(block, set()):
            if child in self._key_of:
                self._unindex(child, freed)
                if child in self._cached:  # nobody holds it: it is simply free now
                    del self._cached[child]
                    freed.append(child)
