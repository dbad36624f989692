"""Defaults that depend on the device: the canonical pass's size R = window x group.

On CUDA a canonical pass of R rows costs about as much as a fast decode step of
R rows, and the paper found R of about 256-512 best: 32 x 8. On the CPU every
row costs its full share of compute, and a lone request pays for all R rows of
each pass, so the default is small: 8 x 4 (R = 32).

The canonical config is part of what a deterministic request's committed bits
depend on (see docs/concepts.md): pass ``window``/``group`` explicitly wherever
runs on different devices must agree.
"""

from __future__ import annotations

import torch

CUDA_CANONICAL_SIZE = (32, 8)
CPU_CANONICAL_SIZE = (8, 4)


def default_canonical_size(device: str | torch.device) -> tuple[int, int]:
    """(window, group) for ``device``: (32, 8) on CUDA, (8, 4) elsewhere."""
    return CUDA_CANONICAL_SIZE if torch.device(device).type == "cuda" else CPU_CANONICAL_SIZE
