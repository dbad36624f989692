"""GGUF checkpoints (llama.cpp's format), read through transformers' GGUF support.

transformers parses the file, reverses llama.cpp's q/k row permutation and
dequantizes every tensor (with the ``gguf`` package); llm42 then maps the
resulting Hugging Face config and state dict onto its own ``ModelConfig`` and
``Weights`` with the same checks as for a safetensors directory. The weights
are dequantized to float32 and cast once to the requested dtype, so a GGUF
file and its ``llm42 convert`` directory load to the same bits.

Reading a GGUF file is slow: transformers parses its metadata once for the
config, once for the tokenizer and once for the tensors (about 20-30 s for a
135M model on a 2-core CPU). ``llm42 convert`` writes a safetensors directory
once; loading that takes about a second.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib.util
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from llm42.model.config import CheckpointError, ModelConfig, UnsupportedModelError

GGUF_INSTALL_HINT = "pip install 'llm42[gguf]'"
_MAGIC = b"GGUF"
# transformers' message for a GGUF architecture it has no mapping for
_UNKNOWN_ARCH = re.compile(r"architecture (\S+) is not supported")
_NO_DEQUANT = re.compile(r"(?:De)?[Qq]uantization for (\S+) is not yet implemented")


@dataclass(frozen=True)
class GGUFModel:
    """What transformers made of a GGUF file: a HF config, its float32 state dict and the tokenizer."""

    file: Path
    hf_config: object  # transformers.PretrainedConfig
    cfg: ModelConfig
    state_dict: dict[str, torch.Tensor]  # HF tensor names, float32, on the CPU
    tokenizer: object | None  # a transformers tokenizer (chat template included when the file has one)
    generation_config: object | None  # transformers.GenerationConfig


def find_gguf_file(path: str | Path) -> Path | None:
    """The GGUF file that ``path`` names, or None when ``path`` is a Hugging Face directory.

    ``path`` may be a ``.gguf`` file or a directory without ``config.json`` that holds
    exactly one ``.gguf`` file. A directory with ``config.json`` is a HF checkpoint
    (None); a missing path, a non-GGUF file, or a directory with no or several
    ``.gguf`` files (and no config.json) raises CheckpointError naming it.
    """
    path = Path(path)
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise CheckpointError(
                f"checkpoint path {str(path)!r} is not a directory (pass a Hugging Face checkpoint "
                "directory, a .gguf file, or a directory holding one .gguf file)"
            )
        return path
    if not path.is_dir():
        kind = "file" if path.suffix.lower() == ".gguf" else "directory"
        raise CheckpointError(f"checkpoint {kind} {str(path)!r} does not exist")
    if (path / "config.json").is_file():
        return None
    found = sorted(p for p in path.iterdir() if p.suffix.lower() == ".gguf" and p.is_file())
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        raise CheckpointError(
            f"checkpoint directory {str(path)!r} holds {len(found)} .gguf files ({names}) and no config.json; "
            "pass the path of the one to load"
        )
    if not found:
        raise CheckpointError(f"checkpoint directory {str(path)!r} has no config.json (and no .gguf file)")
    return found[0]


def _missing_packages() -> list[str]:
    return [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]


def _require_packages(file: Path) -> None:
    missing = _missing_packages()
    if missing:
        raise UnsupportedModelError(
            f"{file}: reading a GGUF file needs the {' and '.join(repr(m) for m in missing)} package(s), "
            f"which are not installed: {GGUF_INSTALL_HINT}"
        )


def _check_header(file: Path) -> None:
    with open(file, "rb") as f:
        magic = f.read(4)
    if magic != _MAGIC:
        raise CheckpointError(f"{file}: not a GGUF file (it starts with {magic!r}, not {_MAGIC!r})")


def _translate(file: Path, exc: Exception) -> ValueError:
    """transformers' and gguf's exceptions as llm42's, naming the file."""
    message = str(exc)
    if match := _UNKNOWN_ARCH.search(message):
        return UnsupportedModelError(
            f"{file}: unsupported GGUF architecture {match.group(1)!r}; llm42 reads llama, mistral, "
            "qwen2 and qwen3 GGUF files"
        )
    if match := _NO_DEQUANT.search(message):
        return UnsupportedModelError(
            f"{file}: unsupported quantization {match.group(1)}: the installed gguf package cannot "
            "dequantize it"
        )
    return CheckpointError(
        f"{file}: not a readable GGUF file, corrupt or truncated ({type(exc).__name__}: {message})"
    )


@contextlib.contextmanager
def _translated(file: Path) -> Iterator[None]:
    try:
        yield
    except (CheckpointError, UnsupportedModelError, MemoryError):
        raise
    except Exception as exc:  # transformers and gguf raise many types for a bad file
        raise _translate(file, exc) from exc


def _read_tokenizer(file: Path):
    """The file's tokenizer, or None for a file that describes none."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name)
    except Exception as exc:
        if not _has_tokenizer_metadata(file):
            return None
        raise CheckpointError(f"{file}: its tokenizer cannot be built ({type(exc).__name__}: {exc})") from exc


def _has_tokenizer_metadata(file: Path) -> bool:
    from gguf import GGUFReader

    with _translated(file):
        return "tokenizer.ggml.model" in GGUFReader(str(file)).fields


def _dtype_kwargs(dtype: torch.dtype) -> dict:
    import transformers

    major, minor = (int(part) for part in transformers.__version__.split(".")[:2])
    # transformers 4.56 renamed `torch_dtype` to `dtype`
    return {"dtype": dtype} if (major, minor) >= (4, 56) else {"torch_dtype": dtype}


def read_gguf(path: str | Path, *, with_tokenizer: bool = True) -> GGUFModel:
    """Parse and dequantize a GGUF file through transformers (float32 tensors, on the CPU).

    Raises UnsupportedModelError for a missing ``gguf``/``accelerate`` package, an
    architecture or quantization llm42 cannot use, and CheckpointError for a file
    that is not a readable GGUF; each names the file.
    """
    file = Path(path)
    if not file.is_file():
        raise CheckpointError(f"checkpoint file {str(file)!r} does not exist")
    _require_packages(file)
    _check_header(file)
    from transformers import AutoConfig, AutoModelForCausalLM

    where, name = str(file.parent), file.name
    with _translated(file):
        hf_config = AutoConfig.from_pretrained(where, gguf_file=name)
    # an architecture llm42 does not implement is refused before the slow part
    cfg = ModelConfig.from_hf_dict(hf_config.to_dict(), source=str(file))
    tokenizer = _read_tokenizer(file) if with_tokenizer else None
    with _translated(file):
        model = AutoModelForCausalLM.from_pretrained(
            where, gguf_file=name, config=hf_config, **_dtype_kwargs(torch.float32)
        )
    state_dict = {k: v.detach() for k, v in model.state_dict().items()}
    generation_config = getattr(model, "generation_config", None)
    eos = getattr(generation_config, "eos_token_id", None)
    if eos is not None:
        ids = tuple(eos) if isinstance(eos, (list, tuple)) else (eos,)
        cfg = dataclasses.replace(cfg, eos_token_ids=tuple(int(i) for i in ids))
    return GGUFModel(file, model.config, cfg, state_dict, tokenizer, generation_config)


def convert_gguf(src: str | Path, dst: str | Path, *, dtype: torch.dtype = torch.float32) -> Path:
    """Write a GGUF file as a Hugging Face safetensors directory.

    ``dst`` gets config.json, model.safetensors, generation_config.json and the
    tokenizer files (with the chat template); ``DVRGenerator.from_pretrained(dst)``
    then loads the same weights as ``from_pretrained(src)`` with the same ``dtype``.
    ``dst`` must not exist or be empty.
    """
    src, dst = Path(src), Path(dst)
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"dtype must be float32, bfloat16 or float16, got {dtype}")
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise CheckpointError(f"destination {str(dst)!r} exists and is not an empty directory")
    model = read_gguf(src)
    save_hf_directory(model, dst, dtype=dtype)
    return dst


def save_hf_directory(model: GGUFModel, dst: str | Path, *, dtype: torch.dtype) -> None:
    """Write a read GGUF model as a HF checkpoint directory (see :func:`convert_gguf`)."""
    from safetensors.torch import save_file

    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    hf_config = copy.deepcopy(model.hf_config)
    hf_config.architectures = hf_config.architectures or [_causal_lm_class(model.cfg)]
    # the tensors are dequantized: the directory is a plain checkpoint in `dtype`
    if hasattr(hf_config, "quantization_config"):
        del hf_config.quantization_config
    setattr(hf_config, "dtype" if hasattr(hf_config, "dtype") else "torch_dtype", dtype)
    hf_config.save_pretrained(str(dst))
    if model.generation_config is not None:
        model.generation_config.save_pretrained(str(dst))
    if model.tokenizer is not None:
        model.tokenizer.save_pretrained(str(dst))
    tensors = {
        name: tensor.to(dtype).contiguous()
        for name, tensor in model.state_dict.items()
        if not (name == "lm_head.weight" and model.cfg.tie_word_embeddings)
    }
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})


def _causal_lm_class(cfg: ModelConfig) -> str:
    return {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
            "qwen3": "Qwen3ForCausalLM"}[cfg.family]
