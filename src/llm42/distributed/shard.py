"""Load one rank's slice of a Hugging Face checkpoint (tensor parallelism).

Megatron's layout: q/k/v and gate/up are split by output feature (column
parallel: heads, kv heads, FFN width), o_proj and down by input feature (row
parallel, reduced across ranks), the embedding and LM head by vocabulary row
(padded to a multiple of the ranks). Norms and the row-parallel biases are
replicated. Each rank reads only its slice from the safetensors files.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from safetensors import SafetensorError

from llm42.distributed.group import TensorParallel
from llm42.model.config import CheckpointError, ModelConfig
from llm42.model.loader import _is_ignorable, _open_safetensors, _safetensors_files, load_config
from llm42.model.weights import Weights, assemble, hf_tensor_shapes
from llm42.ops.exact import RowShard

_COLUMN_PARALLEL = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")  # split along dim 0
_ROW_PARALLEL = ("o_proj", "down_proj")  # weights split along dim 1; biases replicated
_VOCAB_PARALLEL = ("model.embed_tokens.weight", "lm_head.weight")


def check_shardable(cfg: ModelConfig, world_size: int) -> None:
    """ValueError naming the field when ``cfg`` cannot be split over ``world_size`` ranks."""
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"tensor_parallel must be a positive int, got {world_size!r}")
    for name, value in (("num_key_value_heads", cfg.num_kv_heads), ("intermediate_size", cfg.intermediate_size)):
        if value % world_size:
            raise ValueError(f"tensor_parallel={world_size} does not divide the model's {name} ({value})")


def shard_config(cfg: ModelConfig, world_size: int) -> ModelConfig:
    """The config one rank computes with: heads, kv heads and FFN width divided by ``world_size``.

    The vocabulary, hidden size and context stay whole (the embedding's
    padded slice is the weights' business, not the config's).
    """
    check_shardable(cfg, world_size)
    return dataclasses.replace(cfg, num_heads=cfg.num_heads // world_size,
                               num_kv_heads=cfg.num_kv_heads // world_size,
                               intermediate_size=cfg.intermediate_size // world_size)


def vocab_rows_per_rank(vocab_size: int, world_size: int) -> int:
    return -(-vocab_size // world_size)


def _slice_of(name: str, shape: tuple[int, ...], tp: TensorParallel) -> tuple[int, int, int] | None:
    """(dim, begin, end) of this rank's part of tensor ``name``, or None when it is replicated."""
    if name in _VOCAB_PARALLEL:
        rows = vocab_rows_per_rank(shape[0], tp.world_size)
        return 0, min(tp.rank * rows, shape[0]), min((tp.rank + 1) * rows, shape[0])
    module = name.rsplit(".", 2)[-2]
    is_weight = name.endswith(".weight")
    if module in _COLUMN_PARALLEL:
        dim = 0
    elif module in _ROW_PARALLEL and is_weight:
        dim = 1
    else:
        return None
    size = shape[dim] // tp.world_size
    return dim, tp.rank * size, (tp.rank + 1) * size


def load_shard(path: str | Path, tp: TensorParallel, *, dtype: torch.dtype, device: torch.device | str,
               num_positions: int | None = None) -> tuple[ModelConfig, ModelConfig, Weights]:
    """(the whole model's config, this rank's config, this rank's weights) from a HF checkpoint directory.

    Each tensor's shape is checked against the whole model's config before
    its slice is read; the row-parallel weights get their ``RowShard`` (each
    output feature's max-abs over all ranks: one all-reduce MAX per weight),
    so the canonical pass slices them as the whole weight. ``num_positions``: RoPE table rows, as
    ``llm42.model.loader.load_checkpoint`` takes them.
    """
    directory = Path(path)
    cfg = load_config(directory)
    local_cfg = shard_config(cfg, tp.world_size)
    shapes = hf_tensor_shapes(cfg)
    tensors: dict[str, torch.Tensor] = {}
    for file in _safetensors_files(directory):
        with _open_safetensors(file) as f:
            for name in f.keys():
                if name not in shapes:
                    if _is_ignorable(name, cfg):
                        continue
                    raise CheckpointError(f"{file.name}: unexpected tensor {name!r}, which the model described by "
                                          "config.json does not have")
                tensors[name] = _read_slice(f, file, name, shapes[name], tp, dtype=dtype, device=device)
    missing = [name for name in shapes if name not in tensors]
    if missing:
        raise CheckpointError(f"checkpoint {str(directory)!r} lacks tensor(s) {', '.join(map(repr, missing[:5]))}")
    weights = assemble(local_cfg, tensors, num_positions=num_positions)
    layers = tuple(
        dataclasses.replace(lw, o_proj_shard=_row_shard(lw.o_proj, tp), down_shard=_row_shard(lw.down, tp))
        for lw in weights.layers
    )
    return cfg, local_cfg, dataclasses.replace(weights, layers=layers, tp=tp)


def _read_slice(f, file: Path, name: str, expected: tuple[int, ...], tp: TensorParallel, *,
                dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    try:
        view = f.get_slice(name)
        shape = tuple(view.get_shape())
        if shape != expected:
            raise CheckpointError(f"{file.name}: tensor {name!r} has shape {shape}, config.json implies {expected}")
        part = _slice_of(name, shape, tp)
        if part is None:
            tensor = view[:]
        elif part[0] == 0:
            tensor = view[part[1]:part[2]]
        else:
            tensor = view[:, part[1]:part[2]]
    except SafetensorError as exc:
        raise CheckpointError(f"{file}: tensor {name!r} cannot be read ({exc})") from exc
    if not tensor.is_floating_point():
        raise CheckpointError(f"{file.name}: tensor {name!r} has dtype {tensor.dtype}, not a floating-point type")
    tensor = tensor.to(device=device, dtype=dtype)
    if not bool(torch.isfinite(tensor).all()):
        raise CheckpointError(f"{file.name}: tensor {name!r} holds NaN or infinite values (a corrupt file?)")
    if name in _VOCAB_PARALLEL:
        rows = vocab_rows_per_rank(expected[0], tp.world_size)
        tensor = torch.cat([tensor, tensor.new_zeros(rows - tensor.shape[0], *tensor.shape[1:])])  # never read
    return tensor


def _row_shard(weight: torch.Tensor, tp: TensorParallel) -> RowShard:
    # each output feature's max-abs over the whole row: the canonical pass scales each rank's columns by it
    amax = tp.all_reduce_max(weight.abs().amax(1, keepdim=True).to(torch.float64))  # [N, 1]
    return RowShard(full_k=weight.shape[1] * tp.world_size, amax=amax)
