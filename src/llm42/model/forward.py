"""The functional decoder: logits = forward(weights, cfg, inputs, kv, policy).

Pure apart from writing this step's K/V into the slots ``inputs.slot_mapping``
names. Every reducing op goes through the policy, so the same code is the fast
path, the canonical pass and the batch-invariant baseline. The row-wise ops
between them (residual add + RMSNorm, RoPE + K/V write, SwiGLU) go through the
policy's ``RowOps`` too, which a policy may fuse into one kernel each.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from llm42.inputs import StepInputs
from llm42.model.config import ModelConfig
from llm42.model.weights import Weights
from llm42.ops.exact import RowShard
from llm42.policies.base import ReductionPolicy, row_ops

if TYPE_CHECKING:
    from llm42.distributed.group import TensorParallel


class KVLayers:
    """What the forward pass needs of a K/V store: per-layer flat caches and the page size."""

    def __init__(self, k: list[torch.Tensor], v: list[torch.Tensor], block_size: int):
        self.k = k  # each [num_slots, Hkv, D]
        self.v = v
        self.block_size = block_size


def forward(
    weights: Weights,
    cfg: ModelConfig,
    inputs: StepInputs,
    kv: KVLayers,
    policy: ReductionPolicy,
) -> torch.Tensor:
    """Run one step over ``inputs.num_rows`` token rows; returns logits [L, V] for the wanted rows."""
    state = embed_rows(weights, inputs)
    state = forward_layers(weights, cfg, inputs, kv, policy, state, 0, len(weights.layers))
    return forward_head(weights, cfg, inputs, policy, state)


# the residual stream between layers: (residual [N, H], the last layer's MLP output not yet added to it, or None
# before the first layer)
LayerState = tuple[torch.Tensor, "torch.Tensor | None"]


def embed_rows(weights: Weights, inputs: StepInputs) -> LayerState:
    """The residual stream before the first layer: the rows' token embeddings."""
    tp = weights.tp
    if tp is None:
        return weights.embed[inputs.token_ids], None  # [N, H]
    return tp.embed(weights.embed, inputs.token_ids), None


def forward_layers(weights: Weights, cfg: ModelConfig, inputs: StepInputs, kv: KVLayers, policy: ReductionPolicy,
                   state: LayerState, start: int, end: int) -> LayerState:
    """Layers ``start .. end - 1`` over the step's rows, from ``state`` (``embed_rows``' or an earlier call's): the
    same ops in the same order whatever the layers are cut into (a canonical pass spread over steps runs them so)."""
    ops = row_ops(policy)
    num_rows = inputs.num_rows
    dtype = weights.dtype
    eps = cfg.rms_norm_eps
    scale = cfg.head_dim**-0.5
    tp = weights.tp
    residual, mlp_out = state
    cos = weights.rope_cos[inputs.positions].to(dtype)  # [N, D]
    sin = weights.rope_sin[inputs.positions].to(dtype)
    for layer in range(start, end):
        lw = weights.layers[layer]
        if mlp_out is None:
            h = policy.rms_norm(residual, lw.input_norm, eps)
        else:
            h, residual = ops.add_rms_norm(mlp_out, residual, lw.input_norm, eps)
        qkv = policy.linear(h, lw.qkv, lw.qkv_bias)
        q, k, v = qkv.split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
        q = q.reshape(num_rows, cfg.num_heads, cfg.head_dim)
        k = k.reshape(num_rows, cfg.num_kv_heads, cfg.head_dim)
        v = v.reshape(num_rows, cfg.num_kv_heads, cfg.head_dim)
        q = ops.rope_and_store(
            q, k, v, cos, sin, kv.k[layer], kv.v[layer], inputs.slot_mapping,
            q_norm=lw.q_norm, k_norm=lw.k_norm, eps=eps,
        )
        attn = _attention(policy, q, kv.k[layer], kv.v[layer], inputs, block_size=kv.block_size, scale=scale,
                          sliding_window=cfg.sliding_window)  # [N, Hq, D]
        attn_out = row_parallel_linear(policy, tp, attn.reshape(num_rows, cfg.q_size), lw.o_proj,
                                       lw.o_proj_bias, lw.o_proj_shard)
        h, residual = ops.add_rms_norm(attn_out, residual, lw.post_norm, eps)
        gate_up = policy.linear(h, lw.gate_up, lw.gate_up_bias)  # [N, 2I]
        mlp_out = row_parallel_linear(policy, tp, ops.swiglu(gate_up), lw.down, lw.down_bias, lw.down_shard)
    return residual, mlp_out


def forward_head(weights: Weights, cfg: ModelConfig, inputs: StepInputs, policy: ReductionPolicy,
                 state: LayerState) -> torch.Tensor:
    """The final norm and the output head over the wanted rows (``inputs.logits_rows``) of the last layer's state."""
    ops = row_ops(policy)
    residual, mlp_out = state
    if inputs.logits_rows is not None:
        residual = residual[inputs.logits_rows]
        mlp_out = mlp_out[inputs.logits_rows]
    h, _ = ops.add_rms_norm(mlp_out, residual, weights.norm, cfg.rms_norm_eps)
    logits = policy.linear(h, weights.lm_head, weights.lm_head_bias)
    if weights.tp is not None:
        logits = weights.tp.gather_vocab(logits, cfg.vocab_size)  # [L, V] on every rank: each samples the same tokens
    return policy.process_logits(logits, inputs)


def _attention(policy: ReductionPolicy, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               inputs: StepInputs, **kwargs) -> torch.Tensor:
    """``policy.attention`` over the step's rows; a joined step's parts (``StepInputs.join``) each on their own."""
    if inputs.parts is None:
        return policy.attention(q, k_cache, v_cache, inputs, **kwargs)
    outs = [policy.attention(q[start: start + part.num_rows], k_cache, v_cache, part, **kwargs)
            for start, part in inputs.parts]
    return torch.cat(outs)


def row_parallel_linear(policy: ReductionPolicy, tp: TensorParallel | None, x: torch.Tensor, weight: torch.Tensor,
                        bias: torch.Tensor | None, shard: RowShard | None) -> torch.Tensor:
    """``policy.linear`` of a row-parallel weight (o_proj, down): x [N, K / ranks], weight [H, K / ranks].

    Without tensor parallelism, the plain linear. With it, the policy's own
    ``row_parallel_linear`` where it has one (the canonical pass: a reduction
    whose bits it fixes), else the partial products all-reduced as the
    library likes (the fast path), then the bias.
    """
    if tp is None:
        return policy.linear(x, weight, bias)
    own = getattr(policy, "row_parallel_linear", None)
    if callable(own):
        return own(x, weight, bias, tp=tp, shard=shard)
    out = tp.all_reduce_sum(policy.linear(x, weight))
    return out if bias is None else out + bias
