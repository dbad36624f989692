"""The functional decoder model, its config and its checkpoint loader."""

from llm42.model.config import CheckpointError, ModelConfig, RopeConfig, UnsupportedModelError
from llm42.model.forward import KVLayers, forward
from llm42.model.gguf import convert_gguf, find_gguf_file
from llm42.model.loader import (
    Checkpoint, embedded_model_path, load_checkpoint, load_config, load_tokenizer, load_weights,
)
from llm42.model.weights import LayerWeights, Weights, random_weights

__all__ = [
    "ModelConfig", "RopeConfig", "UnsupportedModelError", "KVLayers", "forward", "CheckpointError",
    "embedded_model_path", "load_config", "load_tokenizer", "load_weights", "LayerWeights", "Weights",
    "random_weights", "Checkpoint", "load_checkpoint", "convert_gguf", "find_gguf_file",
]
