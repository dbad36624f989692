"""Load a checkpoint: a Hugging Face directory (config.json + *.safetensors (+ tokenizer)) or a GGUF file.

Safetensors only: no pickle, no remote code. The expected tensors are laid out
as ``meta`` tensors from the config first; every loaded tensor is checked
against that skeleton (name, shape) before it is cast and placed. A GGUF file
(or a directory holding exactly one) goes through ``llm42.model.gguf``, whose
dequantized state dict meets the same checks.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from llm42.model.config import CheckpointError, ModelConfig
from llm42.model.gguf import find_gguf_file, read_gguf
from llm42.model.weights import Weights, assemble, hf_tensor_shapes, meta_tensors


@dataclass(frozen=True)
class Checkpoint:
    """A loaded checkpoint: its config, weights (on the target device and dtype) and tokenizer."""

    cfg: ModelConfig
    weights: Weights
    tokenizer: object | None  # a transformers tokenizer, or None when the checkpoint ships none
    source: Path  # the HF directory or the GGUF file


def load_checkpoint(
    path: str | Path, *, dtype: torch.dtype, device: torch.device | str, with_tokenizer: bool = True,
    num_positions: int | None = None,
) -> Checkpoint:
    """Load a HF checkpoint directory, a ``.gguf`` file, or a directory holding exactly one ``.gguf``.

    A directory with config.json is always read as a HF checkpoint. GGUF weights are
    dequantized to ``dtype``. ``num_positions``: rows of the RoPE tables (default: the
    model's context; a generator with a shorter ``max_model_len`` needs no more). Raises
    CheckpointError / UnsupportedModelError naming the file or directory and what is wrong.
    """
    path = Path(path)
    gguf_file = find_gguf_file(path)
    if gguf_file is not None:
        model = read_gguf(gguf_file, with_tokenizer=with_tokenizer)
        entries = ((gguf_file.name, name, tensor) for name, tensor in model.state_dict.items())
        weights = _checked_weights(entries, model.cfg, dtype=dtype, device=device, source=gguf_file,
                                   implied_by="the GGUF metadata", num_positions=num_positions)
        return Checkpoint(model.cfg, weights, model.tokenizer, gguf_file)
    cfg = load_config(path)
    weights = load_weights(path, cfg, dtype=dtype, device=device, num_positions=num_positions)
    return Checkpoint(cfg, weights, load_tokenizer(path) if with_tokenizer else None, path)


def load_config(path: str | Path) -> ModelConfig:
    directory = Path(path)
    if not directory.exists():
        raise CheckpointError(f"checkpoint directory {str(directory)!r} does not exist")
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint path {str(directory)!r} is not a directory")
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"checkpoint directory {str(directory)!r} has no config.json")
    raw = _read_json(config_file)
    if not isinstance(raw, dict):
        raise CheckpointError(f"{config_file}: expected a JSON object, got {type(raw).__name__}")
    cfg = ModelConfig.from_hf_dict(raw, source=str(config_file))
    eos_ids = _generation_eos_ids(directory / "generation_config.json")
    return cfg if eos_ids is None else dataclasses.replace(cfg, eos_token_ids=eos_ids)


def _read_json(file: Path):
    """The JSON in ``file``; CheckpointError naming the file when it is not UTF-8 JSON."""
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{file}: not UTF-8 text ({exc})") from exc
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{file}: not valid JSON ({exc})") from exc


def _generation_eos_ids(file: Path) -> tuple[int, ...] | None:
    # Chat models often list their end-of-turn ids only here (Llama-3-Instruct: 128001, 128008,
    # 128009); transformers' generate() stops on these, not on config.json's.
    if not file.is_file():
        return None
    raw = _read_json(file)
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
            weight_map = _read_json(index)["weight_map"]
        except (KeyError, TypeError) as exc:
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
    path: str | Path, cfg: ModelConfig, *, dtype: torch.dtype, device: torch.device | str,
    num_positions: int | None = None,
) -> Weights:
    directory = Path(path)
    return _checked_weights(_safetensors_entries(directory), cfg, dtype=dtype, device=device,
                            source=directory, implied_by="config.json", num_positions=num_positions)


def _safetensors_entries(directory: Path) -> Iterator[tuple[str, str, torch.Tensor]]:
    for file in _safetensors_files(directory):
        with _open_safetensors(file) as f:
            for name in f.keys():
                try:
                    tensor = f.get_tensor(name)
                except SafetensorError as exc:
                    raise CheckpointError(f"{file}: tensor {name!r} cannot be read ({exc})") from exc
                yield file.name, name, tensor


def load_state_dict(path: str | Path, cfg: ModelConfig, *, dtype: torch.dtype,
                    device: torch.device | str) -> dict[str, torch.Tensor]:
    """A checkpoint's tensors by Hugging Face name, checked against ``cfg`` and cast to ``dtype``.

    ``path`` as for ``load_checkpoint``; the checkpoint's own config must describe the same
    model (``update_weights`` uses this to load new weights for a running generator).
    """
    path = Path(path)
    gguf_file = find_gguf_file(path)
    if gguf_file is not None:
        model = read_gguf(gguf_file, with_tokenizer=False)
        entries = ((gguf_file.name, name, tensor) for name, tensor in model.state_dict.items())
        return _checked_tensors(entries, cfg, dtype=dtype, device=device, source=gguf_file,
                                implied_by="the generator's model")
    load_config(path)  # a readable config.json, or a clear error
    return _checked_tensors(_safetensors_entries(path), cfg, dtype=dtype, device=device, source=path,
                            implied_by="the generator's model")


def check_state_dict(state_dict, cfg: ModelConfig, *, dtype: torch.dtype, strict: bool = True
                     ) -> dict[str, torch.Tensor]:
    """A user's state dict (Hugging Face names) checked against ``cfg``: names, shapes, dtype ``dtype``.

    Raises TypeError for a value that is not a tensor or has another dtype, ValueError for an unknown
    name, a wrong shape or (``strict``) a missing tensor; each error names the tensor.
    """
    if not hasattr(state_dict, "items"):
        raise TypeError(f"update_weights takes a state dict or a checkpoint path, got {type(state_dict).__name__}")
    shapes = hf_tensor_shapes(cfg)
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in state_dict.items():
        if name not in shapes:
            if _is_ignorable(name, cfg):
                continue
            raise ValueError(f"state dict tensor {name!r} is not a tensor of this model")
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"state dict entry {name!r} is a {type(tensor).__name__}, not a tensor")
        if tuple(tensor.shape) != shapes[name]:
            raise ValueError(f"state dict tensor {name!r} has shape {tuple(tensor.shape)}, the model's is "
                             f"{shapes[name]}")
        if tensor.dtype != dtype:
            raise TypeError(f"state dict tensor {name!r} has dtype {tensor.dtype}, the model's weights are {dtype} "
                            "(cast it first: update_weights copies bits, it does not convert)")
        tensors[name] = tensor
    missing = [name for name in shapes if name not in tensors]
    if strict and missing:
        shown = ", ".join(repr(m) for m in missing[:5])
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise ValueError(f"state dict lacks tensor(s) {shown}{more} (pass strict=False to update only some)")
    return tensors


def _checked_weights(
    entries: Iterable[tuple[str, str, torch.Tensor]], cfg: ModelConfig, *, dtype: torch.dtype,
    device: torch.device | str, source: Path, implied_by: str, num_positions: int | None,
) -> Weights:
    """Weights from (file name, tensor name, tensor) entries, each checked against the config's skeleton."""
    return assemble(cfg, _checked_tensors(entries, cfg, dtype=dtype, device=device, source=source,
                                          implied_by=implied_by), num_positions=num_positions)


def _checked_tensors(
    entries: Iterable[tuple[str, str, torch.Tensor]], cfg: ModelConfig, *, dtype: torch.dtype,
    device: torch.device | str, source: Path, implied_by: str,
) -> dict[str, torch.Tensor]:
    skeleton = meta_tensors(cfg, dtype)
    tensors: dict[str, torch.Tensor] = {}
    for where, name, tensor in entries:
        if name not in skeleton:
            if _is_ignorable(name, cfg):
                continue
            # a tensor the config does not account for (a bias, an extra norm) would be
            # silently dropped and the logits silently wrong
            raise CheckpointError(
                f"{where}: unexpected tensor {name!r}, which the model described by {implied_by} does not have"
            )
        expected = tuple(skeleton[name].shape)
        if tuple(tensor.shape) != expected:
            raise CheckpointError(
                f"{where}: tensor {name!r} has shape {tuple(tensor.shape)}, {implied_by} implies {expected}"
            )
        if not tensor.is_floating_point():
            raise CheckpointError(f"{where}: tensor {name!r} has dtype {tensor.dtype}, not a floating-point type")
        placed = tensor.to(device=device, dtype=dtype)
        # corrupt bytes and diverged training runs show up as NaN/inf; loaded, they generate token 0
        if not bool(torch.isfinite(placed).all()):
            raise CheckpointError(f"{where}: tensor {name!r} holds NaN or infinite values (a corrupt file?)")
        tensors[name] = placed
    missing = [name for name in skeleton if name not in tensors]
    if missing:
        shown = ", ".join(repr(m) for m in missing[:5])
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise CheckpointError(f"checkpoint {str(source)!r} lacks tensor(s) {shown}{more}")
    return tensors


# the class names transformers writes for a plain tokenizer.json (v4, v5)
_GENERIC_TOKENIZER_CLASSES = ("PreTrainedTokenizerFast", "TokenizersBackend")


def load_tokenizer(path: str | Path):
    """The checkpoint's tokenizer through transformers, or None if it ships none.

    A tokenizer.json whose tokenizer_config.json names the generic class loads through that
    class directly: it is what AutoTokenizer resolves to, without importing the model's config
    classes first (about 2 s of a CPU start). Anything else goes through AutoTokenizer.
    """
    directory = Path(path)
    if not any((directory / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        return None
    if (directory / "tokenizer.json").is_file() and _tokenizer_class(directory) in _GENERIC_TOKENIZER_CLASSES:
        from transformers import PreTrainedTokenizerFast as tokenizer_class
    else:
        from transformers import AutoTokenizer as tokenizer_class
    try:
        return tokenizer_class.from_pretrained(str(directory), trust_remote_code=False)
    except Exception as exc:  # tokenizers and transformers raise many types, none naming the file
        files = [f for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
                 if (directory / f).is_file()]
        raise CheckpointError(f"{directory}: the tokenizer ({', '.join(files)}) cannot be loaded "
                              f"({type(exc).__name__}: {exc})") from exc


def _tokenizer_class(directory: Path) -> str | None:
    try:
        raw = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):  # JSON and UTF-8 errors are ValueErrors
        return None  # AutoTokenizer reports what is wrong
    return raw.get("tokenizer_class") if isinstance(raw, dict) else None


def embedded_model_path() -> Path:
    """Directory of the embedded stories260K checkpoint (MIT, Karpathy's tinyllamas)."""
    return Path(__file__).resolve().parent.parent / "data" / "stories260K"
