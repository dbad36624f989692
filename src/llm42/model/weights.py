"""Model weights as an explicit, immutable pytree of tensors.

Projections that read the same input are stored fused ([q; k; v] and
[gate; up]) so the forward pass issues one GEMM for each.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from llm42.model.config import ModelConfig, rope_inv_freq
from llm42.ops.exact import RowShard

if TYPE_CHECKING:
    from llm42.distributed.group import TensorParallel


@dataclass(frozen=True)
class LayerWeights:
    input_norm: torch.Tensor  # [H]
    qkv: torch.Tensor  # [q_size + 2 * kv_size, H]
    qkv_bias: torch.Tensor | None  # [q_size + 2 * kv_size]
    q_norm: torch.Tensor | None  # [head_dim]
    k_norm: torch.Tensor | None  # [head_dim]
    o_proj: torch.Tensor  # [H, q_size]
    post_norm: torch.Tensor  # [H]
    gate_up: torch.Tensor  # [2 * I, H]
    down: torch.Tensor  # [H, I]
    o_proj_bias: torch.Tensor | None = None  # [H]
    gate_up_bias: torch.Tensor | None = None  # [2 * I]
    down_bias: torch.Tensor | None = None  # [H]
    # tensor parallelism: o_proj and down hold this rank's input columns; these slice them as the whole
    o_proj_shard: RowShard | None = None
    down_shard: RowShard | None = None


@dataclass(frozen=True)
class Weights:
    embed: torch.Tensor  # [V, H]
    layers: tuple[LayerWeights, ...]
    norm: torch.Tensor  # [H]
    lm_head: torch.Tensor  # [V, H] (the embedding itself when tied)
    rope_cos: torch.Tensor  # [num_positions, head_dim] float32: positions 0 .. num_positions - 1 can run
    rope_sin: torch.Tensor  # [num_positions, head_dim] float32
    # a bias added to the logits: no supported checkpoint family has one; the benchmarks' calibrated random
    # heads do (llm42.bench.figures.HeadBasis)
    lm_head_bias: torch.Tensor | None = None  # [V]
    # tensor parallelism: this rank's group; embed/lm_head then hold its vocabulary rows [ceil(V / ranks), H]
    tp: TensorParallel | None = None

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    def linears(self) -> tuple[tuple[str, torch.Tensor, torch.Tensor | None], ...]:
        """(name, weight, bias) of every GEMM shape the model runs: layer 0's (all layers share the shapes) and the
        output head."""
        lw = self.layers[0]
        return (("qkv", lw.qkv, lw.qkv_bias), ("o_proj", lw.o_proj, lw.o_proj_bias),
                ("gate_up", lw.gate_up, lw.gate_up_bias), ("down", lw.down, lw.down_bias),
                ("lm_head", self.lm_head, self.lm_head_bias))

    @property
    def device(self) -> torch.device:
        return self.embed.device


def hf_tensor_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The tensor names and shapes a Hugging Face checkpoint of this config must hold."""
    h, i, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (cfg.vocab_size, h),
        "model.norm.weight": (h,),
    }
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    for n in range(cfg.num_layers):
        p = f"model.layers.{n}."
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        shapes[p + "self_attn.q_proj.weight"] = (cfg.q_size, h)
        shapes[p + "self_attn.k_proj.weight"] = (cfg.kv_size, h)
        shapes[p + "self_attn.v_proj.weight"] = (cfg.kv_size, h)
        shapes[p + "self_attn.o_proj.weight"] = (h, cfg.q_size)
        if cfg.attention_bias:
            shapes[p + "self_attn.q_proj.bias"] = (cfg.q_size,)
            shapes[p + "self_attn.k_proj.bias"] = (cfg.kv_size,)
            shapes[p + "self_attn.v_proj.bias"] = (cfg.kv_size,)
        if cfg.o_proj_bias:
            shapes[p + "self_attn.o_proj.bias"] = (h,)
        if cfg.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (d,)
            shapes[p + "self_attn.k_norm.weight"] = (d,)
        shapes[p + "mlp.gate_proj.weight"] = (i, h)
        shapes[p + "mlp.up_proj.weight"] = (i, h)
        shapes[p + "mlp.down_proj.weight"] = (h, i)
        if cfg.mlp_bias:
            shapes[p + "mlp.gate_proj.bias"] = (i,)
            shapes[p + "mlp.up_proj.bias"] = (i,)
            shapes[p + "mlp.down_proj.bias"] = (h,)
    return shapes


def meta_tensors(cfg: ModelConfig, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors as ``meta`` tensors: the skeleton loaded tensors are checked against."""
    return {name: torch.empty(shape, dtype=dtype, device="meta") for name, shape in hf_tensor_shapes(cfg).items()}


def rope_tables(cfg: ModelConfig, device: torch.device | str, num_positions: int | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [num_positions, head_dim] in float32 (default: the model's context), the rotate-half
    layout transformers uses.

    Always computed on the CPU over the model's whole context, then cut to ``num_positions`` rows:
    the library's vectorized cos/sin hands a loop's last few elements to a scalar tail, which can
    round differently, and where that tail falls depends on the tensor's size. Computing the same
    full-size tensor every time gives a position's row the same bits whatever ``num_positions`` is
    (the table is committed arithmetic: RoPE feeds the canonical pass). The full table is transient
    host memory (2 x 4 x context x head_dim bytes: 128 MiB at 131,072 positions and head_dim 128)."""
    inv_freq = rope_inv_freq(cfg)
    context = cfg.max_position_embeddings
    rows = context if num_positions is None else num_positions
    positions = torch.arange(context, dtype=torch.float32)
    freqs = positions[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    if rows < context:  # a copy of the rows kept, so the full tables are freed
        cos, sin = cos[:rows].clone(), sin[:rows].clone()
    return cos.to(device), sin.to(device)


def with_rope_positions(weights: Weights, cfg: ModelConfig, num_positions: int) -> Weights:
    """``weights`` whose RoPE tables have exactly ``num_positions`` rows (the others shared, not copied).
    Fewer rows are cut from the tables held (the same values: see ``rope_tables``); more are computed."""
    rows = weights.rope_cos.shape[0]
    if rows == num_positions:
        return weights
    if rows > num_positions:
        cos, sin = weights.rope_cos[:num_positions].clone(), weights.rope_sin[:num_positions].clone()
    else:
        cos, sin = rope_tables(cfg, weights.device, num_positions)
    return dataclasses.replace(weights, rope_cos=cos, rope_sin=sin)


def assemble(cfg: ModelConfig, tensors: dict[str, torch.Tensor], *, num_positions: int | None = None) -> Weights:
    """Build Weights from HF-named tensors (already on the target device and dtype); RoPE tables of
    ``num_positions`` rows (default: the model's context)."""
    layers = []
    for n in range(cfg.num_layers):
        p = f"model.layers.{n}."
        attn = p + "self_attn."
        qkv = torch.cat([tensors[attn + f"{x}_proj.weight"] for x in "qkv"], dim=0)
        qkv_bias = (
            torch.cat([tensors[attn + f"{x}_proj.bias"] for x in "qkv"], dim=0) if cfg.attention_bias else None
        )
        layers.append(
            LayerWeights(
                input_norm=tensors[p + "input_layernorm.weight"],
                qkv=qkv,
                qkv_bias=qkv_bias,
                q_norm=tensors[attn + "q_norm.weight"] if cfg.qk_norm else None,
                k_norm=tensors[attn + "k_norm.weight"] if cfg.qk_norm else None,
                o_proj=tensors[attn + "o_proj.weight"],
                post_norm=tensors[p + "post_attention_layernorm.weight"],
                gate_up=torch.cat([tensors[p + "mlp.gate_proj.weight"], tensors[p + "mlp.up_proj.weight"]], dim=0),
                down=tensors[p + "mlp.down_proj.weight"],
                o_proj_bias=tensors[attn + "o_proj.bias"] if cfg.o_proj_bias else None,
                gate_up_bias=(
                    torch.cat([tensors[p + "mlp.gate_proj.bias"], tensors[p + "mlp.up_proj.bias"]], dim=0)
                    if cfg.mlp_bias else None
                ),
                down_bias=tensors[p + "mlp.down_proj.bias"] if cfg.mlp_bias else None,
            )
        )
    embed = tensors["model.embed_tokens.weight"]
    cos, sin = rope_tables(cfg, embed.device, num_positions)
    return Weights(
        embed=embed,
        layers=tuple(layers),
        norm=tensors["model.norm.weight"],
        lm_head=embed if cfg.tie_word_embeddings else tensors["lm_head.weight"],
        rope_cos=cos,
        rope_sin=sin,
    )


def weight_views(cfg: ModelConfig, weights: Weights) -> dict[str, torch.Tensor]:
    """Each Hugging Face tensor name -> the view of ``weights`` holding it (the inverse of ``assemble``).

    Fused projections give row slices ([q; k; v], [gate; up]); writing into a view writes the
    weights themselves (``update_weights``).
    """
    views = {"model.embed_tokens.weight": weights.embed, "model.norm.weight": weights.norm}
    if not cfg.tie_word_embeddings:
        views["lm_head.weight"] = weights.lm_head
    if weights.lm_head_bias is not None:
        views["lm_head.bias"] = weights.lm_head_bias

    def split(names: list[str], weight: torch.Tensor, bias: torch.Tensor | None, sizes: list[int]) -> None:
        begin = 0
        for name, size in zip(names, sizes):
            views[name + ".weight"] = weight[begin: begin + size]
            if bias is not None:
                views[name + ".bias"] = bias[begin: begin + size]
            begin += size

    q, kv, i, h = cfg.q_size, cfg.kv_size, cfg.intermediate_size, cfg.hidden_size
    for n, lw in enumerate(weights.layers):
        p = f"model.layers.{n}."
        attn = p + "self_attn."
        views[p + "input_layernorm.weight"] = lw.input_norm
        views[p + "post_attention_layernorm.weight"] = lw.post_norm
        split([attn + f"{x}_proj" for x in "qkv"], lw.qkv, lw.qkv_bias, [q, kv, kv])
        split([attn + "o_proj"], lw.o_proj, lw.o_proj_bias, [h])
        if lw.q_norm is not None:
            views[attn + "q_norm.weight"] = lw.q_norm
            views[attn + "k_norm.weight"] = lw.k_norm
        split([p + "mlp.gate_proj", p + "mlp.up_proj"], lw.gate_up, lw.gate_up_bias, [i, i])
        split([p + "mlp.down_proj"], lw.down, lw.down_bias, [h])
    return views


def random_weights(
    cfg: ModelConfig,
    *,
    seed: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    std: float = 0.02,
    lm_head_std: float | None = None,
) -> Weights:
    """Seeded random weights for a config alone (no checkpoint).

    ``lm_head_std`` scales the output head separately: a larger value makes the
    logits peaked like a trained model's (large top-1/top-2 gaps). On a CUDA
    device the values are drawn there, from a CUDA generator seeded with
    ``seed`` (an 8B-parameter model takes well under a second); they differ
    from the CPU draw for the same seed, which is unchanged.
    """
    device = torch.device(device)
    draw_on = device if device.type == "cuda" else torch.device("cpu")
    generator = torch.Generator(device=draw_on).manual_seed(seed)
    tensors = {}
    for name, shape in hf_tensor_shapes(cfg).items():
        if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            t = torch.ones(shape, device=draw_on)
        elif name.endswith(".bias"):
            t = torch.randn(shape, generator=generator, device=draw_on) * std
        else:
            scale = lm_head_std if (name == "lm_head.weight" and lm_head_std is not None) else std
            t = torch.randn(shape, generator=generator, device=draw_on).mul_(scale)
        tensors[name] = t.to(device=device, dtype=dtype)
        del t
    return assemble(cfg, tensors)
