"""Load a Hugging Face checkpoint directory: config.json + *.safetensors (+ tokenizer).

Safetensors only: no pickle, no remote code. The expected tensors are laid out
as ``meta`` tensors from the config first; every loaded tensor is checked
against that skeleton (name, shape) before it is cast and placed.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from llm42.model.config import ModelConfig
from llm42.model.weights import Weights, assemble, meta_tensors


class CheckpointError(ValueError):
    """A checkpoint directory is missing, incomplete, or does not match its config."""


def load_config(path: str | Path) -> ModelConfig:
    directory = Path(path)
    if not directory.exists():
        raise CheckpointError(f"checkpoint directory {str(directory)!r} does not exist")
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint path {str(directory)!r} is not a directory")
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"checkpoint directory {str(directory)!r} has no config.json")
    try:
        raw = json.loads(config_file.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{config_file}: not valid JSON ({exc})") from exc
    if not isinstance(raw, dict):
        raise CheckpointError(f"{config_file}: expected a JSON object, got {type(raw).__name__}")
    cfg = ModelConfig.from_hf_dict(raw, source=str(config_file))
    eos_ids = _generation_eos_ids(directory / "generation_config.json")
    return cfg if eos_ids is None else dataclasses.replace(cfg, eos_token_ids=eos_ids)


def _generation_eos_ids(file: Path) -> tuple[int, ...] | None:
    # Chat models often list their end-of-turn ids only here (Llama-3-Instruct: 128001, 128008,
    # 128009); transformers' generate() stops on these, not on config.json's.
    if not file.is_file():
        return None
    try:
        raw = json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{file}: not valid JSON ({exc})") from exc
    eos = raw.get("eos_token_id") if isinstance(raw, dict) else None
    if eos is None:
        return None
    eos = eos if isinstance(eos, list) else [eos]
    if not all(isinstance(e, int) and not isinstance(e, bool) and e >= 0 for e in eos):
        raise CheckpointError(f"{file}: eos_token_id must be a non-negative int or a list of them, got {eos!r}")
    return tuple(eos)


def _safetensors_files(directory: Path) -> list[Path]:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{index}: not a valid safetensors index with a 'weight_map' ({exc!r})") from exc
        files = sorted({directory / name for name in weight_map.values()})
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"{index}: names shard(s) that are not present: {missing}")
        return files
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise CheckpointError(
            f"checkpoint directory {str(directory)!r} has no *.safetensors file "
            "(llm42 loads safetensors only, never pickled .bin files)"
        )
    return files


def _open_safetensors(file: Path):
    try:
        return safe_open(str(file), framework="pt", device="cpu")
    except SafetensorError as exc:
        raise CheckpointError(f"{file}: not a readable safetensors file ({exc})") from exc


def _is_ignorable(name: str, cfg: ModelConfig) -> bool:
    # tied checkpoints may still carry lm_head; some older exports store RoPE caches
    return (name == "lm_head.weight" and cfg.tie_word_embeddings) or name.endswith("rotary_emb.inv_freq")


def load_weights(
    path: str | Path, cfg: ModelConfig, *, dtype: torch.dtype, device: torch.device | str
) -> Weights:
    directory = Path(path)
    skeleton = meta_tensors(cfg, dtype)
    tensors: dict[str, torch.Tensor] = {}
    for file in _safetensors_files(directory):
        with _open_safetensors(file) as f:
            for name in f.keys():
                if name not in skeleton:
                    if _is_ignorable(name, cfg):
                        continue
                    # a tensor the config does not account for (a bias, an extra norm) would be
                    # silently dropped and the logits silently wrong
                    raise CheckpointError(
                        f"{file.name}: unexpected tensor {name!r}, which the model described by "
                        "config.json does not have"
                    )
                tensor = f.get_tensor(name)
                expected = tuple(skeleton[name].shape)
                if tuple(tensor.shape) != expected:
                    raise CheckpointError(
                        f"{file.name}: tensor {name!r} has shape {tuple(tensor.shape)}, "
                        f"config.json implies {expected}"
                    )
                tensors[name] = tensor.to(device=device, dtype=dtype)
    missing = [name for name in skeleton if name not in tensors]
    if missing:
        shown = ", ".join(repr(m) for m in missing[:5])
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise CheckpointError(f"checkpoint {str(directory)!r} lacks tensor(s) {shown}{more}")
    return assemble(cfg, tensors)


def load_tokenizer(path: str | Path):
    """The checkpoint's tokenizer through transformers' AutoTokenizer, or None if it ships none."""
    directory = Path(path)
    if not any((directory / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory), trust_remote_code=False)


def embedded_model_path() -> Path:
    """Directory of the embedded stories260K checkpoint (MIT, Karpathy's tinyllamas)."""
    return Path(__file__).resolve().parent.parent / "data" / "stories260K"
