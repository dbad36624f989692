"""SamplingParams (validated on creation) and Completion, the public value types."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

MAX_TOP_LOGPROBS = 20  # top-N alternatives per token: the bound vLLM and OpenAI use
LOGPROBS_MODES = ("raw", "processed")
_INT64_SPAN = 1 << 64
_SAMPLE_STRIDE = 0x9E3779B97F4A7C15  # 2^64 / golden ratio: a Weyl sequence of per-sample seeds


def seed_to_int64(seed: int) -> int:
    """Any Python int as the int64 the sampler hashes (two's complement wrap)."""
    value = seed % _INT64_SPAN
    return value - _INT64_SPAN if value >= 1 << 63 else value


def sample_seed(seed: int, index: int) -> int:
    """The seed of sample ``index`` of a request with ``SamplingParams(seed=seed, n=...)``.

    ``seed + index * 0x9E3779B97F4A7C15`` wrapped to a signed 64-bit int, so sample 0 keeps
    ``seed`` (as the engine folds it) (``n=1`` is unchanged) and sample i of an ``n``-sample request is reproduced
    alone by ``SamplingParams(seed=sample_seed(seed, i))`` with the other fields the same.
    """
    return seed_to_int64(seed + index * _SAMPLE_STRIDE)


def _check_int(name: str, value: object, *, minimum: int | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"SamplingParams.{name} must be an int, got {type(value).__name__} {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"SamplingParams.{name} must be >= {minimum}, got {value}")


def _check_number(name: str, value: object) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(f"SamplingParams.{name} must be a number, got {type(value).__name__} {value!r}")
    if math.isnan(value):
        raise ValueError(f"SamplingParams.{name} must not be NaN")
    return float(value)


@dataclass(frozen=True)
class SamplingParams:
    """How one request is decoded. Invalid values raise ValueError/TypeError naming the field.

    ``deterministic=True`` makes the committed tokens and log-probs a function of
    (weights, prompt, these params, the generator's canonical config) only. A
    deterministic request sampled with ``temperature > 0`` and ``seed=None``
    uses seed 0, so it is still reproducible.
    """

    max_new_tokens: int = 64
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    deterministic: bool = False
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: bool | int = False
    logprobs_mode: Literal["raw", "processed"] = "raw"
    n: int = 1

    def __post_init__(self) -> None:
        _check_int("max_new_tokens", self.max_new_tokens, minimum=1)
        temperature = _check_number("temperature", self.temperature)
        if temperature < 0 or math.isinf(temperature):
            raise ValueError(f"SamplingParams.temperature must be finite and >= 0, got {self.temperature}")
        _check_int("top_k", self.top_k, minimum=0)
        top_p = _check_number("top_p", self.top_p)
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None:
            _check_int("seed", self.seed)
        for flag in ("deterministic", "ignore_eos"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"SamplingParams.{flag} must be a bool, got {getattr(self, flag)!r}")
        if not isinstance(self.logprobs, int):
            raise TypeError(f"SamplingParams.logprobs must be a bool or an int, got {self.logprobs!r}")
        if not isinstance(self.logprobs, bool) and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"SamplingParams.logprobs must be a bool or an int in [0, {MAX_TOP_LOGPROBS}], "
                             f"got {self.logprobs}")
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"SamplingParams.logprobs_mode must be one of {LOGPROBS_MODES}, "
                             f"got {self.logprobs_mode!r}")
        _check_int("n", self.n, minimum=1)
        stops = self.stop_token_ids
        if isinstance(stops, (str, bytes)) or not hasattr(stops, "__iter__"):
            raise TypeError(f"SamplingParams.stop_token_ids must be a sequence of ints, got {stops!r}")
        stops = tuple(stops)
        for token in stops:
            if not isinstance(token, int) or isinstance(token, bool):
                raise TypeError(f"SamplingParams.stop_token_ids must hold ints, got {type(token).__name__} {token!r}")
            if token < 0:
                raise ValueError(f"SamplingParams.stop_token_ids must hold non-negative ints, got {token!r}")
        object.__setattr__(self, "stop_token_ids", stops)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def wants_logprobs(self) -> bool:
        """``logprobs`` is True or an int: ``Completion.logprobs`` is filled."""
        return self.logprobs is not False

    @property
    def num_top_logprobs(self) -> int:
        """N of ``logprobs=N`` (0 for a bool): alternatives per token in ``Completion.top_logprobs``."""
        return 0 if isinstance(self.logprobs, bool) else self.logprobs

    @property
    def is_processed_logprobs(self) -> bool:
        return self.logprobs_mode == "processed"


@dataclass
class Completion:
    """The result of one request. Only committed tokens ever appear here."""

    request_id: int
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str | None = None
    finish_reason: Literal["stop", "length", "abort"] | None = None  # "abort": stopped by abort() or close()
    logprobs: list[float] | None = None
    num_rollbacks: int = 0
    num_recomputed: int = 0
    top_logprobs: list[dict[int, float]] | None = None  # with logprobs=N: per token, N ids -> log-probs
