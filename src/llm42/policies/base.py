"""The ReductionPolicy protocol: how each reducing op of the model is computed."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from llm42.inputs import StepInputs


@runtime_checkable
class ReductionPolicy(Protocol):
    """What the functional model asks of a policy.

    ``is_shape_closed`` is True for a policy whose every kernel launch has a
    shape that is a function of the canonical config only; the verifier refuses
    a canonical policy without it.
    """

    name: str
    is_shape_closed: bool

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor: ...

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor: ...

    def attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        inputs: StepInputs,
        *,
        block_size: int,
        scale: float,
        sliding_window: int | None,
    ) -> torch.Tensor: ...

    def process_logits(self, logits: torch.Tensor, inputs: StepInputs) -> torch.Tensor: ...
