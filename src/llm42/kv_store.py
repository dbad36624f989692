"""Kept for imports of ``llm42.kv_store``: the K/V store lives in ``llm42.kv``."""

from llm42.kv import KVStore, KVStoreProtocol

__all__ = ["KVStore", "KVStoreProtocol"]
