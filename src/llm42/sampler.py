"""Greedy and seeded sampling, with noise that is a pure function of (seed, position, vocab id).

Seeded sampling is Gumbel-max: token = argmax(logits / T + g), where g is
Gumbel noise computed from a counter-based hash of (seed, position, vocab id)
inside the step, never drawn from a stateful generator. So a token's draw does
not depend on what else was sampled before it, in this batch or any other —
the fast path and the canonical pass see the same noise for the same position,
which is also why candidates are usually accepted.

Every reduction and transcendental here is ``llm42.ops.exact``'s (exact sums,
exp/log from correctly rounded primitives), so a row's log-probs, filter and
noise are the same bits at any batch size, on any instruction set and on
either device; they stay plain torch ops, with no host sync, so a CUDA graph
can capture them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llm42.ops import exact

_MASK32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B1


def _mix32(x: torch.Tensor) -> torch.Tensor:
    # a 32-bit avalanche hash on int64 tensors holding values in [0, 2^32);
    # constants < 2^28 keep every product inside int64
    x = ((x >> 16) ^ x) * 0x45D9F3B & _MASK32
    x = ((x >> 16) ^ x) * 0x45D9F3B & _MASK32
    return (x >> 16) ^ x


def gumbel_noise(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Gumbel noise [N, V] in float32; row i depends only on (seeds[i], positions[i])."""
    seeds = seeds.to(torch.int64)
    lo = seeds & _MASK32
    hi = (seeds >> 32) & _MASK32
    key = _mix32(_mix32(lo ^ 0x5BD1E995) ^ hi)
    key = _mix32(key ^ (positions.to(torch.int64) * _GOLDEN & _MASK32))  # [N]
    vocab = torch.arange(vocab_size, device=seeds.device, dtype=torch.int64)
    bits = _mix32(_mix32(key[:, None] ^ (vocab[None, :] * 0x27D4EB2F & _MASK32)) ^ 0x165667B1)
    # 24 random bits -> u in (0, 1), exactly representable in float32
    u = ((bits >> 8).to(torch.float64) + 0.5) * (1.0 / (1 << 24))
    return (-exact.log64(-exact.log64(u))).to(torch.float32)


@dataclass(frozen=True)
class SamplingRows:
    """Per-row sampling parameters of one step (all tensors [N]).

    ``is_any_sampled`` is the host's knowledge of whether any row has
    ``temperature > 0``. Given, ``sample`` never synchronises with the device
    (so it can run inside a CUDA graph); ``None`` makes ``sample`` read it off
    ``temperature``. ``True`` with only greedy rows is allowed and gives the same
    tokens; ``False`` with a sampled row would be wrong.
    """

    temperature: torch.Tensor  # float32, 0 = greedy
    top_k: torch.Tensor  # int64, 0 = off
    top_p: torch.Tensor  # float32, 1 = off
    seeds: torch.Tensor  # int64
    positions: torch.Tensor  # int64: the position of the token being sampled
    is_any_sampled: bool | None = None


def _filter_top_k_top_p(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    # scaled: [N, V]; returns scaled with tokens outside top-k / top-p set to -inf
    vocab_size = scaled.shape[-1]
    sorted_vals, _ = torch.sort(scaled, dim=-1, descending=True, stable=True)
    k = torch.where(top_k > 0, top_k.clamp(max=vocab_size), vocab_size)
    kth = sorted_vals.gather(1, (k - 1)[:, None])  # [N, 1]
    rank = torch.arange(vocab_size, device=scaled.device)
    sorted_vals = torch.where(rank[None, :] < k[:, None], sorted_vals, float("-inf"))
    probs = exact.softmax(sorted_vals)  # float64
    mass_before = exact.row_cumsum(probs) - probs
    keep = (mass_before < top_p[:, None]) & (rank[None, :] < k[:, None])
    keep[:, 0] = True
    num_keep = keep.sum(-1)
    threshold = sorted_vals.gather(1, (num_keep - 1)[:, None])
    threshold = torch.maximum(threshold, kth)
    return torch.where(scaled >= threshold, scaled, float("-inf"))


def processed_scores(logits: torch.Tensor, rows: SamplingRows) -> torch.Tensor:
    """``logits / temperature`` restricted to the top-k / top-p support ([N, V] float32, -inf outside it).

    Greedy rows are scaled by 1; the sampler never reads them from here.
    """
    temperature = torch.where(rows.temperature > 0, rows.temperature, 1.0)
    return _filter_top_k_top_p(logits / temperature[:, None], rows.top_k, rows.top_p)


def sample(logits: torch.Tensor, rows: SamplingRows) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row; returns (tokens [N] int64, log-probs [N] float32 of the raw distribution)."""
    logits = logits.float()
    logprobs_all = exact.log_softmax(logits)
    greedy = torch.argmax(logits, dim=-1)
    is_sampled = rows.temperature > 0
    is_any_sampled = rows.is_any_sampled if rows.is_any_sampled is not None else bool(is_sampled.any())
    if is_any_sampled:
        scaled = processed_scores(logits, rows)
        noise = gumbel_noise(rows.seeds, rows.positions, logits.shape[-1])
        drawn = torch.argmax(scaled + noise, dim=-1)
        tokens = torch.where(is_sampled, drawn, greedy)
    else:
        tokens = greedy
    return tokens, logprobs_all.gather(1, tokens[:, None]).squeeze(1)


def logprob_details(logits: torch.Tensor, tokens: torch.Tensor, rows: SamplingRows, is_processed: torch.Tensor,
                    num_top: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-probs of ``tokens`` and each row's ``num_top`` most likely tokens, raw or processed per row.

    logits: [N, V]; tokens: [N] int64 (sampled, or given when scoring); is_processed: [N] bool.
    A raw row's distribution is ``log_softmax(logits)`` (the bits ``sample`` returns); a processed
    row's is the one ``sample`` draws from: ``log_softmax`` over the top-k / top-p support of
    ``logits / temperature``, or for a greedy row probability 1 on ``tokens`` (log-prob 0) and 0
    elsewhere. Returns (log-probs [N] float32, top ids [N, num_top] int64, top log-probs
    [N, num_top] float32), the top ones ordered by log-prob, then by token id (a stable sort, so the
    order is a function of the row alone); entries of probability 0 hold -inf.
    """
    logits = logits.float()
    logprobs_all = exact.log_softmax(logits)
    if bool(is_processed.any()):
        processed = exact.log_softmax(processed_scores(logits, rows))
        vocab = torch.arange(logits.shape[-1], device=logits.device)
        point_mass = torch.where(vocab[None, :] == tokens[:, None], 0.0, float("-inf"))
        processed = torch.where((rows.temperature > 0)[:, None], processed, point_mass)
        logprobs_all = torch.where(is_processed[:, None], processed, logprobs_all)
    chosen = logprobs_all.gather(1, tokens[:, None]).squeeze(1)
    if num_top == 0:
        return chosen, tokens.new_zeros((len(tokens), 0)), chosen.new_zeros((len(tokens), 0))
    top_logprobs, top_ids = torch.sort(logprobs_all, dim=-1, descending=True, stable=True)
    return chosen, top_ids[:, :num_top], top_logprobs[:, :num_top]
