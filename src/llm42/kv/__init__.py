"""Paged K/V storage, in three parts stacked bottom to top.

- ``tensors``: the per-layer K/V tensors and their scratch slots (``KVTensors``);
- ``prefix``: the prefix index of shareable canonical blocks and the LRU of the ones nobody holds
  (``PrefixIndex``);
- ``blocks``: block accounting (free list, reference counts, reservations, block tables, canonical
  marks) and ``KVStore``, the default store composing the other two; ``KVStoreProtocol``, what the
  engine needs from any store.
"""

from llm42.kv.blocks import KVStore, KVStoreProtocol

__all__ = ["KVStore", "KVStoreProtocol"]
