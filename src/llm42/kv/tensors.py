"""The K/V tensors: one flat ``[num_slots, Hkv, D]`` tensor pair per layer, addressed by slot.

Slot ``block * block_size + offset`` holds position ``offset`` of ``block``. The
``num_blocks`` real blocks come first; the scratch blocks after them take the K/V
writes of dummy (padding) rows, so a pass can pad to its fixed shape without
touching anyone's K/V. Which block belongs to whom is the block accounting's
business (``kv/blocks.py``); this module only allocates and addresses.
"""

from __future__ import annotations

import torch

from llm42.model.config import ModelConfig
from llm42.model.forward import KVLayers


class KVTensors:
    """Per-layer K and V tensors for ``num_blocks`` real blocks plus at least ``num_scratch_slots`` scratch slots."""

    def __init__(self, cfg: ModelConfig, *, num_blocks: int, block_size: int, num_scratch_slots: int,
                 dtype: torch.dtype, device: torch.device | str):
        self.block_size = block_size
        self.scratch_block = num_blocks  # the first block past the real ones
        num_scratch_blocks = -(-num_scratch_slots // block_size)
        self.num_scratch_slots = num_scratch_blocks * block_size  # rounded up to whole blocks
        num_slots = (num_blocks + num_scratch_blocks) * block_size
        shape = (num_slots, cfg.num_kv_heads, cfg.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_layers)]

    def release(self) -> None:
        """Drop the K/V tensors (their device memory returns once nothing else holds them): the lists are emptied in
        place, so every ``KVLayers`` made from them lets go too. Nothing may read or write the store after."""
        self.k.clear()
        self.v.clear()

    def scratch_slot(self, index: int) -> int:
        """The scratch slot a dummy row ``index`` writes to (scratch slots are reused cyclically)."""
        return self.scratch_block * self.block_size + index % self.num_scratch_slots

    def layers(self) -> KVLayers:
        """The tensors as the model's ``forward`` takes them."""
        return KVLayers(self.k, self.v, self.block_size)
