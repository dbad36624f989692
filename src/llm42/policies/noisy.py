"""NoisyFastPolicy: a test-only fast path whose candidates diverge on purpose."""

from __future__ import annotations

import torch

from llm42.inputs import StepInputs
from llm42.policies.fast import FastPolicy


class NoisyFastPolicy(FastPolicy):
    """FastPolicy plus seeded Gaussian noise on the logits, ``scale`` times each row's logit std.

    It exists to prove that committed output does not depend on the fast path:
    with a large ``scale`` almost every candidate is wrong and must be rolled
    back. Never a default.
    """

    name = "noisy_fast"
    is_graph_safe = False  # draws its noise from a host-side generator at every call

    def __init__(self, scale: float = 1.0, seed: int = 0):
        if not isinstance(scale, (int, float)) or scale < 0:
            raise ValueError(f"scale must be a non-negative number, got {scale!r}")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise TypeError(f"seed must be an int, got {type(seed).__name__}")
        self.scale = float(scale)
        self.seed = seed
        self._generator = torch.Generator(device="cpu")
        self._generator.manual_seed(seed)

    def process_logits(self, logits: torch.Tensor, inputs: StepInputs) -> torch.Tensor:
        noise = torch.randn(logits.shape, generator=self._generator, dtype=torch.float32)
        std = logits.float().std(dim=-1, keepdim=True)
        return (logits.float() + self.scale * std * noise.to(logits.device)).to(logits.dtype)

    def __repr__(self) -> str:
        return f"NoisyFastPolicy(scale={self.scale}, seed={self.seed})"
