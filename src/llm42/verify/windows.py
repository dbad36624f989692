"""Canonical config, verify windows, and the commit rule."""

from __future__ import annotations

from dataclasses import dataclass

from llm42.runner import Segment


@dataclass(frozen=True)
class CanonicalConfig:
    """The canonical pass's fixed shape: R = window * group rows.

    Committed output is a function of this config (through R and the
    canonical policy), so two generators agree bit for bit only if they share it.
    """

    window: int = 32
    group: int = 8

    def __post_init__(self) -> None:
        for name in ("window", "group"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")

    @property
    def num_rows(self) -> int:
        return self.window * self.group


@dataclass(frozen=True)
class Commit:
    """The outcome of one canonical pass for one request.

    ``token_ids`` are final (before stop handling): the accepted candidates
    followed by the first canonical token after them. ``num_kv_valid`` is the
    number of leading positions whose K/V is now canonical. ``logprobs`` are in
    the request's ``logprobs_mode``; ``top_logprobs`` (one dict per committed token)
    only when the pass computed top-N alternatives.
    """

    rid: int
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    num_accepted: int
    num_rejected: int
    num_kv_valid: int
    is_prefill: bool
    top_logprobs: tuple[dict[int, float], ...] = ()


def commit_window(segment: Segment, sampled: list[int], logprobs: list[float],
                  top_logprobs: list[dict[int, float]] | None = None) -> Commit:
    """Apply the commit rule to one verify window.

    ``segment.tokens`` = [last committed token, candidate 1, ..., candidate c];
    ``sampled[i]`` is the canonical token for position ``segment.start + i + 1``.
    Accept the longest prefix of candidates the canonical pass agrees with,
    then commit the canonical token right after it (always at least one token).
    """
    candidates = segment.tokens[1:]
    num_accepted = 0
    while num_accepted < len(candidates) and sampled[num_accepted] == candidates[num_accepted]:
        num_accepted += 1
    return Commit(
        rid=segment.rid,
        token_ids=tuple(sampled[: num_accepted + 1]),
        logprobs=tuple(logprobs[: num_accepted + 1]),
        num_accepted=num_accepted,
        num_rejected=len(candidates) - num_accepted,
        num_kv_valid=segment.start + num_accepted + 1,
        is_prefill=False,
        top_logprobs=tuple(top_logprobs[: num_accepted + 1]) if top_logprobs is not None else (),
    )
