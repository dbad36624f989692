"""The models benchmarks run: a tiny random model (CPU), the embedded stories260K, the 8B shape, or a checkpoint
(a Hugging Face directory, a ``.gguf`` file or a directory holding one).

Random weights are fine for throughput: the work per token depends on the
shapes only. Rollback rates depend on how peaked the logits are (how often the
fast path's drift flips the top token), which a random model only imitates
through its output head: its scale (``DEFAULT_LM_HEAD_STD``), and the logit
bias that ``benchmarks/paper_figures.py`` calibrates to a real model's flip rate.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from llm42.model.config import ModelConfig, RopeConfig
from llm42.model.gguf import find_gguf_file
from llm42.model.loader import embedded_model_path, load_checkpoint, load_config, load_tokenizer, load_weights
from llm42.model.weights import Weights, hf_tensor_shapes, random_weights

MODEL_NAMES = ("tiny", "stories260k", "8b")
# std of the random output head, by model; the 8B shape's 0.2 (as in benchmarks/gpu_bench.py) makes
# its logits peaked like a trained model's (median top-1/top-2 gap 2.0 measured there)
DEFAULT_LM_HEAD_STD = {"tiny": None, "8b": 0.2}


@dataclass(frozen=True)
class BenchModel:
    name: str
    cfg: ModelConfig
    weights: Weights
    description: str
    lm_head_std: float | None = None  # random models only; None = the same std as every other weight
    lm_head_bias_scale: float | None = None  # random models only: the logit-bias scale calibrated by paper_figures.py
    tokenizer: object | None = None  # a checkpoint's tokenizer (builds chat prompts); None for random models
    source: str | None = None  # the checkpoint path, for tools that load it again (transformers)

    def summary(self) -> dict:
        cfg = self.cfg
        num_params = sum(math.prod(shape) for shape in hf_tensor_shapes(cfg).values())
        return {
            "name": self.name,
            "description": self.description,
            "dtype": str(self.weights.dtype).removeprefix("torch."),
            "num_params": num_params,
            "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.intermediate_size,
            "num_layers": cfg.num_layers,
            "num_heads": cfg.num_heads,
            "num_kv_heads": cfg.num_kv_heads,
            "head_dim": cfg.head_dim,
            "max_position_embeddings": cfg.max_position_embeddings,
            "lm_head_std": self.lm_head_std,
            "lm_head_bias_scale": self.lm_head_bias_scale,
            "tie_word_embeddings": cfg.tie_word_embeddings,
            "source": self.source,
        }


def tiny_config(max_positions: int) -> ModelConfig:
    """A small random Llama for the CPU smoke run (2 layers, hidden 128, FFN 256, vocab 512)."""
    return ModelConfig(
        family="llama", vocab_size=512, hidden_size=128, intermediate_size=256, num_layers=2, num_heads=4,
        num_kv_heads=2, head_dim=32, max_position_embeddings=max_positions, rms_norm_eps=1e-5,
        rope=RopeConfig(theta=10000.0), eos_token_ids=(2,), bos_token_id=1,
    )


def llama31_8b_shape(max_positions: int) -> ModelConfig:
    """Llama-3.1-8B's shapes from ``llm42.model.config.llama31_8b_config``, context cut to ``max_positions``.

    A shorter context changes nothing per token; it only keeps the canonical
    pass's block tables (one row per token, sized by the context) small.
    """
    from llm42.model import config as config_module

    make = getattr(config_module, "llama31_8b_config", None)
    if make is None:
        raise RuntimeError(
            "--model 8b needs llm42.model.config.llama31_8b_config(), which this checkout does not have "
            "(it comes with the GPU-kernels work); update the checkout or pass a checkpoint directory as --model"
        )
    return make(max_position_embeddings=max_positions)


def _checkpoint(name: str, path: Path, description: str, *, device: torch.device, dtype: torch.dtype,
                max_positions: int, with_tokenizer: bool) -> BenchModel:
    if find_gguf_file(path) is not None:
        checkpoint = load_checkpoint(path, dtype=dtype, device=device, with_tokenizer=with_tokenizer)
        cfg, weights, tokenizer = checkpoint.cfg, checkpoint.weights, checkpoint.tokenizer
    else:
        cfg, weights, tokenizer = load_config(path), None, None
    if cfg.max_position_embeddings < max_positions:
        raise ValueError(f"the workloads need {max_positions} positions but {name} has a context of "
                         f"{cfg.max_position_embeddings}; use a smaller --length-scale")
    # a shorter context leaves every position's RoPE the same and keeps canonical block tables small
    cfg = dataclasses.replace(cfg, max_position_embeddings=max_positions)
    if weights is None:
        weights = load_weights(path, cfg, dtype=dtype, device=device)
        tokenizer = _tokenizer(path) if with_tokenizer else None
    return BenchModel(name, cfg, weights, description, tokenizer=tokenizer, source=str(path))


def _tokenizer(path: Path):
    try:
        return load_tokenizer(path)
    except Exception:  # noqa: BLE001 - a checkpoint without (readable) tokenizer files runs on token ids
        return None


def build_model(name: str, *, device: torch.device, dtype: torch.dtype, max_positions: int, seed: int = 0,
                lm_head_std: float | None = None, with_tokenizer: bool = False) -> BenchModel:
    """``name``: 'tiny', 'stories260k', '8b', a Hugging Face checkpoint directory or a ``.gguf`` file.

    ``max_positions``: the context the workloads need; random models get exactly it (a
    checkpoint's is cut to it). ``lm_head_std``: for random models; None takes
    ``DEFAULT_LM_HEAD_STD``. ``with_tokenizer``: also load a checkpoint's tokenizer.
    """
    if lm_head_std is None:
        lm_head_std = DEFAULT_LM_HEAD_STD.get(name)
    if name == "tiny":
        cfg = tiny_config(max_positions)
        weights = random_weights(cfg, seed=seed, dtype=dtype, device=device, lm_head_std=lm_head_std)
        return BenchModel(name, cfg, weights, "random weights, 2 layers, hidden 128 (CPU smoke model)", lm_head_std)
    if name == "stories260k":
        return _checkpoint(name, embedded_model_path(), "embedded stories260K checkpoint (trained, 5 layers, "
                           "hidden 64)", device=device, dtype=dtype, max_positions=max_positions,
                           with_tokenizer=with_tokenizer)
    if name == "8b":
        cfg = llama31_8b_shape(max_positions)
        # random_weights draws on the device itself: well under a second for 8B parameters on a GPU
        weights = random_weights(cfg, seed=seed, dtype=dtype, device=device, lm_head_std=lm_head_std)
        return BenchModel(name, cfg, weights, "random weights with Llama-3.1-8B shapes", lm_head_std)
    path = Path(name)
    if not (path.is_dir() or (path.is_file() and path.suffix.lower() == ".gguf")):
        raise ValueError(f"--model must be one of {MODEL_NAMES}, a checkpoint directory or a .gguf file, "
                         f"got {name!r}")
    return _checkpoint(model_label(path), path, f"checkpoint {path}", device=device, dtype=dtype,
                       max_positions=max_positions, with_tokenizer=with_tokenizer)


def model_label(path: Path) -> str:
    """A short name for a checkpoint path: its directory or file stem, lower case, quantization suffix dropped."""
    stem = path.stem if path.is_file() else path.name
    return stem.split(".")[0].lower() or "model"
