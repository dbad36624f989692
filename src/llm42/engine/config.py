"""EngineConfig: every engine knob in one frozen value, validated once."""

from __future__ import annotations

from dataclasses import dataclass


def positive_int(owner: str, name: str, value: object) -> int:
    """The one positive-integer check: bools are not integers here."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{owner} {name} must be an int, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{owner} {name} must be a positive integer, got {value!r}")
    return value


def strict_bool(owner: str, name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{owner} {name} must be a bool, got {type(value).__name__} {value!r}")
    return value


@dataclass(frozen=True)
class EngineConfig:
    """The engine's sizes and switches (the canonical config lives in ``CanonicalConfig``).

    ``max_num_seqs``: requests running at once (decode batch bound). ``max_fast_tokens``:
    token rows one fast step may process. ``kv_cache_tokens``: K/V store size; ``None`` sizes it
    from the device. ``block_size``: K/V page size. ``prefix_cache``: share canonical prefix
    blocks. ``seed``: seeds non-deterministic requests that give none. ``use_cuda_graphs``:
    replay captured graphs on CUDA. ``adaptive_draft``: halve/double each deterministic request's
    speculation depth on rollback/full acceptance. ``overlap``: launch fast step n+1 before reading
    step n's tokens back (one-step lag, as serving engines do; committed output is unchanged).
    """

    max_num_seqs: int = 256
    max_fast_tokens: int = 512
    kv_cache_tokens: int | None = None
    block_size: int = 16
    prefix_cache: bool = True
    seed: int = 0
    use_cuda_graphs: bool = True
    adaptive_draft: bool = False
    overlap: bool = True

    def __post_init__(self) -> None:
        owner = "DVRGenerator"
        for name in ("max_num_seqs", "max_fast_tokens", "block_size"):
            positive_int(owner, name, getattr(self, name))
        if self.kv_cache_tokens is not None:
            positive_int(owner, "kv_cache_tokens", self.kv_cache_tokens)
        for name in ("prefix_cache", "use_cuda_graphs", "adaptive_draft", "overlap"):
            strict_bool(owner, name, getattr(self, name))
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise TypeError(f"{owner} seed must be an int, got {type(self.seed).__name__} {self.seed!r}")
