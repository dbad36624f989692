"""Model hyper-parameters, parsed from a Hugging Face ``config.json``.

One frozen dataclass covers the Llama, Mistral, Qwen2 and Qwen3 families; the
differences between them are a handful of flags (q/k/v bias, q/k RMSNorm,
sliding window, RoPE scaling).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# architecture name -> family flags
_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
_SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


class UnsupportedModelError(ValueError):
    """The checkpoint names an architecture or option llm42 does not implement."""


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete, unreadable, or does not match its config."""


@dataclass(frozen=True)
class RopeConfig:
    theta: float
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope: RopeConfig
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v projections carry a bias (Qwen2; Llama/Qwen3 attention_bias)
    o_proj_bias: bool = False  # the output projection carries a bias (Llama/Qwen3 attention_bias)
    mlp_bias: bool = False  # gate/up/down projections carry a bias (Llama mlp_bias)
    qk_norm: bool = False  # per-head RMSNorm on q and k before RoPE (Qwen3)
    sliding_window: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                     "num_heads", "num_kv_heads", "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"config field {name!r} must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"config: num_attention_heads ({self.num_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_kv_heads})"
            )
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"config field 'sliding_window' must be >= 1, got {self.sliding_window}")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def num_query_groups(self) -> int:
        return self.num_heads // self.num_kv_heads

    @classmethod
    def from_hf_dict(cls, raw: dict[str, Any], *, source: str = "config.json") -> "ModelConfig":
        """Parse a HF config dict; raises UnsupportedModelError / ValueError naming the field."""
        archs = raw.get("architectures") or []
        family = next((_ARCHITECTURES[a] for a in archs if a in _ARCHITECTURES), None)
        if family is None:
            model_type = raw.get("model_type")
            by_type = {v: v for v in _ARCHITECTURES.values()}
            family = by_type.get(model_type)
        if family is None:
            raise UnsupportedModelError(
                f"{source}: unsupported architecture {archs or raw.get('model_type')!r}; "
                f"llm42 supports {sorted(_ARCHITECTURES)}"
            )

        def need(key: str) -> Any:
            if key not in raw or raw[key] is None:
                raise ValueError(f"{source}: missing required field {key!r}")
            return raw[key]

        hidden_act = raw.get("hidden_act", "silu")
        if hidden_act not in ("silu", "swish"):
            raise UnsupportedModelError(f"{source}: unsupported hidden_act {hidden_act!r}; llm42 implements 'silu'")
        hidden = need("hidden_size")
        num_heads = need("num_attention_heads")
        head_dim = raw.get("head_dim") or hidden // num_heads
        eos = raw.get("eos_token_id")
        eos_ids: tuple[int, ...] = () if eos is None else tuple(eos) if isinstance(eos, list) else (eos,)
        sliding = raw.get("sliding_window") if family == "mistral" else None
        # which projections carry biases, as each transformers family builds them: Qwen2 always has
        # q/k/v biases and nothing else; Llama/Qwen3 `attention_bias` covers q/k/v *and* o_proj;
        # Mistral has none whatever the config says
        has_attention_bias = family in ("llama", "qwen3") and bool(raw.get("attention_bias", False))
        has_mlp_bias = family == "llama" and bool(raw.get("mlp_bias", False))
        if family in ("qwen2", "qwen3") and raw.get("use_sliding_window", False):
            # Qwen's per-layer window (max_window_layers) is not implemented.
            raise UnsupportedModelError(f"{source}: use_sliding_window=true is not supported for {family}")
        return cls(
            family=family,
            vocab_size=need("vocab_size"),
            hidden_size=hidden,
            intermediate_size=need("intermediate_size"),
            num_layers=need("num_hidden_layers"),
            num_heads=num_heads,
            num_kv_heads=raw.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            max_position_embeddings=raw.get("max_position_embeddings", 2048),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope=_parse_rope(raw, source),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=family == "qwen2" or has_attention_bias,
            o_proj_bias=has_attention_bias,
            mlp_bias=has_mlp_bias,
            qk_norm=family == "qwen3",
            sliding_window=sliding,
            eos_token_ids=eos_ids,
            bos_token_id=raw.get("bos_token_id"),
        )



def llama31_8b_config(*, max_position_embeddings: int = 8192, num_layers: int = 32) -> ModelConfig:
    """The shape of Llama-3.1-8B (hidden 4096, 32 layers, 32/8 heads, FFN 14336, vocab 128256,
    RoPE theta 500000 with llama3 scaling: factor 8, low 1, high 4, original context 8192).

    The real model's context is 131072 positions; the default here is 8192 so
    that RoPE tables, block tables and the default K/V store stay small. Pass
    ``num_layers`` to build a shallower model of the same width.
    """
    return ModelConfig(
        family="llama",
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_layers=num_layers,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        max_position_embeddings=max_position_embeddings,
        rms_norm_eps=1e-5,
        rope=RopeConfig(theta=500000.0, rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                        high_freq_factor=4.0, original_max_position_embeddings=8192),
        eos_token_ids=(128001, 128008, 128009),
        bos_token_id=128000,
    )

def _parse_rope(raw: dict[str, Any], source: str) -> RopeConfig:
    # transformers >= 5 writes `rope_parameters` (theta inside); older files
    # write `rope_theta` plus an optional `rope_scaling` dict.
    params = dict(raw.get("rope_parameters") or {})
    scaling = raw.get("rope_scaling") or {}
    params = {**scaling, **params}
    theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in _SUPPORTED_ROPE_TYPES:
        raise UnsupportedModelError(
            f"{source}: unsupported rope_type {rope_type!r}; llm42 supports {list(_SUPPORTED_ROPE_TYPES)}"
        )
    partial = params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise UnsupportedModelError(f"{source}: partial_rotary_factor={partial} is not supported (only 1.0)")
    # like transformers, llama3 scaling without original_max_position_embeddings uses the context length
    original_max = params.get("original_max_position_embeddings", raw.get("max_position_embeddings", 2048))
    return RopeConfig(
        theta=float(theta),
        rope_type=rope_type,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(original_max),
    )


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Inverse frequencies [head_dim // 2] in float32, following transformers' rope init functions."""
    import torch

    rope = cfg.rope
    dim = cfg.head_dim
    inv_freq = 1.0 / (rope.theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if rope.rope_type == "linear":
        return inv_freq / rope.factor
    if rope.rope_type == "llama3":
        low_wavelen = rope.original_max_position_embeddings / rope.low_freq_factor
        high_wavelen = rope.original_max_position_embeddings / rope.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
        smooth = (rope.original_max_position_embeddings / wavelen - rope.low_freq_factor) / (
            rope.high_freq_factor - rope.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        is_medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return torch.where(is_medium, smoothed, scaled)
    return inv_freq
