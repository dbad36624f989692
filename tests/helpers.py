"""Small shared builders for the project's own tests (not part of the public llm42.testing)."""

from __future__ import annotations

from llm42.model.config import ModelConfig, RopeConfig


def wide_config(*, vocab_size: int = 512, hidden_size: int = 512, num_layers: int = 2,
                max_position_embeddings: int = 256) -> ModelConfig:
    """Wide enough (hidden 512, fp32) that CPU GEMMs drift with the batch size."""
    return ModelConfig(
        family="llama", vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_layers=num_layers, num_heads=8, num_kv_heads=4, head_dim=hidden_size // 8,
        max_position_embeddings=max_position_embeddings, rms_norm_eps=1e-5, rope=RopeConfig(theta=10000.0),
        eos_token_ids=(2,), bos_token_id=1,
    )


def tiny_config(**overrides) -> ModelConfig:
    fields = dict(
        family="llama", vocab_size=128, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
        num_kv_heads=2, head_dim=16, max_position_embeddings=128, rms_norm_eps=1e-5,
        rope=RopeConfig(theta=10000.0), eos_token_ids=(2,), bos_token_id=1,
    )
    fields.update(overrides)
    return ModelConfig(**fields)
