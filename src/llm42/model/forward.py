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
    """Run one step over ``inputs.num_rows`` token rows; returns logits [L, V] for the wanted rows.

    A policy with ``overlap_decode`` set runs a decode step of at least its ``overlap_min_rows`` rows as two
    halves (``forward_layers_overlapped``); every other step, layer after layer over all its rows."""
    state = embed_rows(weights, inputs)
    halves = _overlap_halves(policy, weights, inputs)
    if halves is None:
        state = forward_layers(weights, cfg, inputs, kv, policy, state, 0, len(weights.layers))
        return forward_head(weights, cfg, inputs, policy, state)
    states = forward_layers_overlapped(weights, cfg, halves, kv, policy, state)
    return torch.cat([forward_head(weights, cfg, half, policy, s) for half, s in zip(halves, states)])


def _overlap_halves(policy: ReductionPolicy, weights: Weights, inputs: StepInputs
                    ) -> tuple[StepInputs, StepInputs] | None:
    """The two halves ``forward_layers_overlapped`` runs, or None where the step runs whole: the policy does not
    ask for it, the step is not a plain decode step, it has fewer rows than the policy's ``overlap_min_rows``,
    or the weights are sharded (tensor parallelism)."""
    if not getattr(policy, "overlap_decode", False) or weights.tp is not None:
        return None
    if not inputs.is_decode or inputs.logits_rows is not None or inputs.num_rows < max(2, policy.overlap_min_rows):
        return None
    return inputs.split_decode(inputs.num_rows // 2)


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
    rows = _Rows(weights, cfg, inputs, policy)
    residual, mlp_out = state
    for layer in range(start, end):
        q, residual = rows.before_attention(layer, kv, residual, mlp_out)
        attn = rows.attention(layer, kv, q)
        residual, mlp_out = rows.after_attention(layer, attn, residual)
    return residual, mlp_out


def forward_layers_overlapped(weights: Weights, cfg: ModelConfig, halves: tuple[StepInputs, StepInputs], kv: KVLayers,
                              policy: ReductionPolicy, state: LayerState) -> tuple[LayerState, LayerState]:
    """Every layer over a decode step cut in two halves (``StepInputs.split_decode``), one half's attention beside
    the other half's GEMMs (nano-batches, as NanoFlow runs them): the decode attention reads K/V at the memory's
    rate while the GEMMs are bound by the tensor cores, and run one after the other they leave each other's
    resource idle.

    The host issues, per layer and half, what comes before the attention (norm, QKV, RoPE, the K/V write), the
    attention, and what comes after it (o_proj, the MLP); on CUDA the attentions go to ``policy.overlap_stream``,
    each waiting for its half's K/V write, and each half's o_proj waits for its own attention only. The order:
    before(A, 0), attention(A, 0), before(B, 0), attention(B, 0); then for each layer l: after(A, l),
    before(A, l + 1), attention(A, l + 1), after(B, l), before(B, l + 1), attention(B, l + 1) — so A's attention
    runs beside B's GEMMs and B's beside A's. Each half runs exactly the ops ``forward_layers`` runs on that half
    alone (the same kernels on the same rows), so its rows get those bits; on the CPU the same order runs on one
    stream. Returns each half's state (``forward`` runs the head on each: a GEMM's bits may follow its rows)."""
    a, b = halves
    rows = (_Rows(weights, cfg, a, policy), _Rows(weights, cfg, b, policy))
    residual, mlp_out = state
    at = a.num_rows
    res = [residual[:at], residual[at:]]
    mlp = [None, None] if mlp_out is None else [mlp_out[:at], mlp_out[at:]]
    side = policy.overlap_stream(residual.device) if residual.is_cuda else None
    pending: list = [None, None]

    def before_and_launch(x: int, layer: int) -> None:
        q, res[x] = rows[x].before_attention(layer, kv, res[x], mlp[x])
        if side is None:
            pending[x] = (rows[x].attention(layer, kv, q), None)
            return
        main = torch.cuda.current_stream(residual.device)
        side.wait_stream(main)  # this half's q and K/V write, and everything before them
        with torch.cuda.stream(side):
            attn = rows[x].attention(layer, kv, q)
            done = torch.cuda.Event()
            done.record(side)
        attn.record_stream(main)  # read on the main stream: not reused by the side stream before that read
        pending[x] = (attn, done)

    def finish(x: int, layer: int) -> None:
        attn, done = pending[x]
        if done is not None:
            torch.cuda.current_stream(residual.device).wait_event(done)  # this half's attention only
        res[x], mlp[x] = rows[x].after_attention(layer, attn, res[x])

    num_layers = len(weights.layers)
    before_and_launch(0, 0)
    before_and_launch(1, 0)
    for layer in range(num_layers):
        for x in (0, 1):
            finish(x, layer)
            if layer + 1 < num_layers:
                before_and_launch(x, layer + 1)
    return (res[0], mlp[0]), (res[1], mlp[1])


class _Rows:
    """One layer's ops over a step's rows, cut at the attention: what comes before it (norm, the QKV projection,
    RoPE and the K/V write), the attention, what comes after it (o_proj, norm, the MLP)."""

    def __init__(self, weights: Weights, cfg: ModelConfig, inputs: StepInputs, policy: ReductionPolicy):
        self.weights, self.cfg, self.inputs, self.policy = weights, cfg, inputs, policy
        self.ops = row_ops(policy)
        self.cos = weights.rope_cos[inputs.positions].to(weights.dtype)  # [N, D]
        self.sin = weights.rope_sin[inputs.positions].to(weights.dtype)

    def before_attention(self, layer: int, kv: KVLayers, residual: torch.Tensor, mlp_out: torch.Tensor | None
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """(q [N, Hq, D], the residual stream) with this layer's K and V written to the store."""
        cfg, policy, ops = self.cfg, self.policy, self.ops
        lw = self.weights.layers[layer]
        eps = cfg.rms_norm_eps
        num_rows = self.inputs.num_rows
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
            q, k, v, self.cos, self.sin, kv.k[layer], kv.v[layer], self.inputs.slot_mapping,
            q_norm=lw.q_norm, k_norm=lw.k_norm, eps=eps,
        )
        return q, residual

    def attention(self, layer: int, kv: KVLayers, q: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        return _attention(self.policy, q, kv.k[layer], kv.v[layer], self.inputs, block_size=kv.block_size,
                          scale=cfg.head_dim**-0.5, sliding_window=cfg.sliding_window)  # [N, Hq, D]

    def after_attention(self, layer: int, attn: torch.Tensor, residual: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """(the residual stream, the MLP's output not yet added to it)."""
        cfg, policy, ops = self.cfg, self.policy, self.ops
        lw = self.weights.layers[layer]
        tp = self.weights.tp
        attn_out = row_parallel_linear(policy, tp, attn.reshape(self.inputs.num_rows, cfg.q_size), lw.o_proj,
                                       lw.o_proj_bias, lw.o_proj_shard)
        h, residual = ops.add_rms_norm(attn_out, residual, lw.post_norm, cfg.rms_norm_eps)
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
