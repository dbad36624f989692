"""The functional decoder: logits = forward(weights, cfg, inputs, kv, policy).

Pure apart from writing this step's K/V into the slots ``inputs.slot_mapping``
names. Every reducing op goes through the policy, so the same code is the fast
path, the canonical pass and the batch-invariant baseline.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from llm42.inputs import StepInputs
from llm42.model.config import ModelConfig
from llm42.model.weights import Weights
from llm42.policies.base import ReductionPolicy


class KVLayers:
    """What the forward pass needs of a K/V store: per-layer flat caches and the page size."""

    def __init__(self, k: list[torch.Tensor], v: list[torch.Tensor], block_size: int):
        self.k = k  # each [num_slots, Hkv, D]
        self.v = v
        self.block_size = block_size


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [N, heads, D]; cos/sin: [N, D] already in x's dtype
    return x * cos[:, None, :] + _rotate_half(x) * sin[:, None, :]


def forward(
    weights: Weights,
    cfg: ModelConfig,
    inputs: StepInputs,
    kv: KVLayers,
    policy: ReductionPolicy,
) -> torch.Tensor:
    """Run one step over ``inputs.num_rows`` token rows; returns logits [L, V] for the wanted rows."""
    num_rows = inputs.num_rows
    dtype = weights.dtype
    scale = cfg.head_dim**-0.5
    x = weights.embed[inputs.token_ids]  # [N, H]
    cos = weights.rope_cos[inputs.positions].to(dtype)  # [N, D]
    sin = weights.rope_sin[inputs.positions].to(dtype)
    for layer, lw in enumerate(weights.layers):
        h = policy.rms_norm(x, lw.input_norm, cfg.rms_norm_eps)
        qkv = policy.linear(h, lw.qkv, lw.qkv_bias)
        q, k, v = qkv.split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
        q = q.reshape(num_rows, cfg.num_heads, cfg.head_dim)
        k = k.reshape(num_rows, cfg.num_kv_heads, cfg.head_dim)
        v = v.reshape(num_rows, cfg.num_kv_heads, cfg.head_dim)
        if lw.q_norm is not None:
            q = policy.rms_norm(q, lw.q_norm, cfg.rms_norm_eps)
            k = policy.rms_norm(k, lw.k_norm, cfg.rms_norm_eps)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        kv.k[layer].index_copy_(0, inputs.slot_mapping, k.to(kv.k[layer].dtype))
        kv.v[layer].index_copy_(0, inputs.slot_mapping, v.to(kv.v[layer].dtype))
        attn = policy.attention(
            q, kv.k[layer], kv.v[layer], inputs,
            block_size=kv.block_size, scale=scale, sliding_window=cfg.sliding_window,
        )  # [N, Hq, D]
        x = x + policy.linear(attn.reshape(num_rows, cfg.q_size), lw.o_proj, lw.o_proj_bias)
        h = policy.rms_norm(x, lw.post_norm, cfg.rms_norm_eps)
        gate, up = policy.linear(h, lw.gate_up, lw.gate_up_bias).chunk(2, dim=-1)
        x = x + policy.linear(F.silu(gate) * up, lw.down, lw.down_bias)
    if inputs.logits_rows is not None:
        x = x[inputs.logits_rows]
    x = policy.rms_norm(x, weights.norm, cfg.rms_norm_eps)
    logits = policy.linear(x, weights.lm_head)
    return policy.process_logits(logits, inputs)
