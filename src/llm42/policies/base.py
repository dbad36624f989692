"""The ReductionPolicy protocol: how each reducing op of the model is computed.

Beside its five members a policy may implement the ``RowOps`` protocol: the
row-wise ops between the GEMMs and attention (residual add + RMSNorm, RoPE +
K/V write, SwiGLU), which a policy can fuse into one kernel launch each.
``TorchRowOps`` is their unfused torch composition, ``FusedRowOps`` the fused
Triton kernels on CUDA, ``ExactRowOps`` adds the order-independent CPU SwiGLU
of ``llm42.ops.exact``; ``row_ops`` gives the model a policy's row ops, with
``TorchRowOps``' defaults for any a policy does not implement.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F

from llm42.inputs import StepInputs
from llm42.ops import exact


@runtime_checkable
class ReductionPolicy(Protocol):
    """What the functional model asks of a policy.

    ``is_shape_closed`` is True for a policy whose every kernel launch has a
    shape that is a function of the canonical config only; the verifier refuses
    a canonical policy without it. ``is_graph_safe`` (optional, default False)
    says the policy's ops may be captured in a CUDA graph and replayed: no host
    syncs, no host-side state that changes between calls.
    """

    name: str
    is_shape_closed: bool

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ weight.T + bias``: x [N, in], weight [out, in], bias [out] or None -> [N, out]. A canonical
        policy must give a row the same bits whatever N is and whatever the other rows hold (at its fixed M)."""
        ...

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """RMSNorm of each row of x [N, H] times weight [H]; a row's result depends on that row alone."""
        ...

    def attention(
        self,
        q: torch.Tensor,  # [N, Hq, D]: one row per token of the step
        k_cache: torch.Tensor,  # [num_slots, Hkv, D]: paged K of one layer (this step's K already stored)
        v_cache: torch.Tensor,  # [num_slots, Hkv, D]
        inputs: StepInputs,
        *,
        block_size: int,
        scale: float,
        sliding_window: int | None,
    ) -> torch.Tensor:
        """Causal attention of each row over its sequence's positions up to its own (``inputs``: positions,
        block tables, context lengths), [N, Hq, D]. A canonical policy's row must not depend on how the
        keys are split across programs by the batch (a fixed key order and split)."""
        ...

    def process_logits(self, logits: torch.Tensor, inputs: StepInputs) -> torch.Tensor:
        """The logits [N, V] the sampler sees; the identity for every library policy but ``NoisyFastPolicy``,
        which perturbs the fast path's to force rollbacks in tests."""
        ...


@runtime_checkable
class RowOps(Protocol):
    """The row-wise ops of the model, which a policy may fuse (optional members of a policy).

    Each row's result must depend on that row's inputs alone: no reduction may
    cross rows. That is necessary, not sufficient: on the CPU an elementwise
    library op may still round a row by where it lands in the tensor (ATen's
    ``sigmoid`` in a vectorized loop body vs its scalar tail), which is why the
    canonical policies take ``ExactRowOps``' SwiGLU there.
    """

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (RMSNorm of ``residual + x``, ``residual + x``); x, residual: [..., H]."""
        ...

    def rope_and_store(
        self,
        q: torch.Tensor,  # [N, Hq, D]
        k: torch.Tensor,  # [N, Hkv, D]
        v: torch.Tensor,  # [N, Hkv, D]
        cos: torch.Tensor,  # [N, D] in q's dtype, each row's entry at its position
        sin: torch.Tensor,  # [N, D]
        k_cache: torch.Tensor,  # [num_slots, Hkv, D]
        v_cache: torch.Tensor,  # [num_slots, Hkv, D]
        slot_mapping: torch.Tensor,  # [N] int64
        *,
        q_norm: torch.Tensor | None = None,  # [D]
        k_norm: torch.Tensor | None = None,  # [D]
        eps: float = 1e-6,
    ) -> torch.Tensor:
        """[Per-head q/k RMSNorm,] RoPE on q and k, K and V written at ``slot_mapping``; returns q [N, Hq, D]."""
        ...

    def swiglu(self, gate_up: torch.Tensor) -> torch.Tensor:
        """SiLU(gate) * up for ``gate_up`` [..., 2I] = [gate; up]; returns [..., I]."""
        ...


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [N, heads, D]; cos/sin: [N, D] already in x's dtype
    return x * cos[:, None, :] + _rotate_half(x) * sin[:, None, :]


class TorchRowOps:
    """``RowOps`` as the unfused torch composition, built on the policy's own ``rms_norm``.

    A mixin for policies: every op is a few plain torch ops (a dozen small
    kernels per layer on a GPU), and exactly what the model computed before
    the row ops became policy members.
    """

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        residual = residual + x
        return self.rms_norm(residual, weight, eps), residual

    def rope_and_store(self, q, k, v, cos, sin, k_cache, v_cache, slot_mapping, *, q_norm=None, k_norm=None,
                       eps=1e-6):
        if q_norm is not None:
            q = self.rms_norm(q, q_norm, eps)
        if k_norm is not None:
            k = self.rms_norm(k, k_norm, eps)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        k_cache.index_copy_(0, slot_mapping, k.to(k_cache.dtype))
        v_cache.index_copy_(0, slot_mapping, v.to(v_cache.dtype))
        return q

    def swiglu(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up


class FusedRowOps(TorchRowOps):
    """``RowOps`` as fused Triton kernels (``llm42.kernels.fused``) for CUDA tensors, one launch each.

    Elsewhere (and for dtype mixes the kernels do not take) the torch defaults
    run, so on the CPU a policy computes exactly what it computed before. The
    fused ``add_rms_norm`` and q/k norm do not call the policy's ``rms_norm``:
    a subclass that changes ``rms_norm`` should take ``TorchRowOps`` instead.
    """

    def add_rms_norm(self, x, residual, weight, eps):
        if x.is_cuda and residual.dtype == x.dtype and residual.shape == x.shape:
            from llm42.kernels import fused  # needs Triton: imported on CUDA only

            return fused.add_rms_norm(x, residual, weight, eps)
        return super().add_rms_norm(x, residual, weight, eps)

    def rope_and_store(self, q, k, v, cos, sin, k_cache, v_cache, slot_mapping, *, q_norm=None, k_norm=None,
                       eps=1e-6):
        norms = () if q_norm is None and k_norm is None else (q_norm, k_norm)
        if q.is_cuda and all(t is not None and t.dtype == q.dtype for t in (k, v, cos, sin, *norms)):
            from llm42.kernels import fused

            return fused.rope_and_store(q, k, v, cos, sin, k_cache, v_cache, slot_mapping,
                                        q_norm=q_norm, k_norm=k_norm, eps=eps)
        return super().rope_and_store(q, k, v, cos, sin, k_cache, v_cache, slot_mapping,
                                      q_norm=q_norm, k_norm=k_norm, eps=eps)

    def swiglu(self, gate_up):
        if gate_up.is_cuda:
            from llm42.kernels import fused

            return fused.swiglu(gate_up)
        return super().swiglu(gate_up)


class ExactRowOps(TorchRowOps):
    """A mixin, listed before a policy's other row ops: SwiGLU on the CPU from ``llm42.ops.exact``.

    ``F.silu`` rounds differently in ATen's vectorized loop body and its scalar
    tail, so a row's activation would depend on where the row lands in the
    tensor; the exact SiLU cannot. CUDA tensors take the next class's SwiGLU.
    The other row ops need nothing of their own: on the CPU they are additions,
    multiplications and the policy's ``rms_norm``.
    """

    def swiglu(self, gate_up):
        if gate_up.is_cuda:
            return super().swiglu(gate_up)
        return exact.swiglu(gate_up)


_ROW_OP_NAMES = ("add_rms_norm", "rope_and_store", "swiglu")


class _DefaultRowOps(TorchRowOps):
    """The row ops of a policy that implements only some (or none) of them: its own where it has them."""

    def __init__(self, policy: ReductionPolicy):
        self._policy = policy
        for name in _ROW_OP_NAMES:
            own = getattr(policy, name, None)
            if callable(own):
                setattr(self, name, own)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return self._policy.rms_norm(x, weight, eps)


def row_ops(policy: ReductionPolicy) -> RowOps:
    """``policy`` itself if it implements every ``RowOps`` member, else an adapter that
    supplies ``TorchRowOps``' defaults (over the policy's ``rms_norm``) for the missing ones."""
    if all(callable(getattr(policy, name, None)) for name in _ROW_OP_NAMES):
        return policy
    return _DefaultRowOps(policy)
