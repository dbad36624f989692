"""Greedy and seeded sampling, with noise that is a pure function of (seed, position, vocab id).

Seeded sampling is Gumbel-max: token = argmax(logits / T + g) (a row where logits / T
overflows, T tiny, uses the equal (logits - max) / T), where g is
Gumbel noise computed from a counter-based hash of (seed, position, vocab id)
inside the step, never drawn from a stateful generator. So a token's draw does
not depend on what else was sampled before it, in this batch or any other —
the fast path and the canonical pass see the same noise for the same position,
which is also why candidates are usually accepted.

On the CPU every reduction and transcendental here is ``llm42.ops.exact``'s
(exact sums, exp/log from correctly rounded primitives), so a row's log-probs,
filter and noise are the same bits at any batch size and on any instruction
set. On CUDA the two sweeps over the vocabulary (row statistics for the greedy
token and the log-prob; Gumbel-max) are Triton kernels with one program per
row and a pinned block size (``llm42.kernels.sampling``): one read of the
logits each instead of dozens of float64 passes, and still a function of the
row alone; they read the head's bf16 logits as they are, and the Gumbel kernel
applies the temperature itself (``FUSED_CUDA_SAMPLER``; the bits of the torch
ops on a float32 copy). The top-k / top-p threshold is a third kernel
(``FILTER_KERNEL``): a search over each row's values, a few reads of the row.
Either way they are plain ops with no host sync, so a CUDA graph can capture them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llm42.ops import exact

_MASK32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B1

# On CUDA, a sampled step reads the head's logits as they are (bf16) and the Gumbel kernel scales them itself
# (``gumbel_argmax(scale=...)``): two reads of [N, V] instead of a float32 copy and about a dozen float32 passes.
# The same bits either way (tests/test_sampling_kernels.py); False scales a float32 copy with torch ops in every
# sampled step (for A/B benchmarks; before round 50 every step did, and read its row statistics off the copy too).
# Before round 55 a step with a top-k / top-p row always took the copy. Read when the sampler runs (a graph: when
# captured).
FUSED_CUDA_SAMPLER = True
# On CUDA the top-k / top-p threshold is ``kernels.sampling.filter_threshold``: a search over each row's raw logits,
# a few reads of the row and no temporaries. False: the torch ops the CPU runs (a stable sort, a float64 softmax and
# an exact cumulative sum over [N, V] of the scaled logits, about 40 passes and some 100 bytes of temporaries per
# element; every step before round 55), for A/B benchmarks. The two define the same threshold in different
# arithmetic (float32 weights of the raw logits in the kernel, exact float64 ones of the scaled logits in the torch
# ops), so a row at the edge of its top-p mass can keep a token more or less; each is a function of the row alone.
# Read when the sampler runs (a graph: when captured).
FILTER_KERNEL = True


def _mix32(x: torch.Tensor) -> torch.Tensor:
    # a 32-bit avalanche hash on int64 tensors holding values in [0, 2^32);
    # constants < 2^28 keep every product inside int64
    x = ((x >> 16) ^ x) * 0x45D9F3B & _MASK32
    x = ((x >> 16) ^ x) * 0x45D9F3B & _MASK32
    return (x >> 16) ^ x


def noise_keys(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The per-row key [N] (int64 in [0, 2^32)) of the noise: a hash of (seed, position)."""
    seeds = seeds.to(torch.int64)
    lo = seeds & _MASK32
    hi = (seeds >> 32) & _MASK32
    key = _mix32(_mix32(lo ^ 0x5BD1E995) ^ hi)
    return _mix32(key ^ (positions.to(torch.int64) * _GOLDEN & _MASK32))


def gumbel_noise(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Gumbel noise [N, V] in float32 (the CPU's); row i depends only on (seeds[i], positions[i])."""
    key = noise_keys(seeds, positions)  # [N]
    vocab = torch.arange(vocab_size, device=seeds.device, dtype=torch.int64)
    bits = _mix32(_mix32(key[:, None] ^ (vocab[None, :] * 0x27D4EB2F & _MASK32)) ^ 0x165667B1)
    # 24 random bits -> u in (0, 1), exact in float64
    u = ((bits >> 8).to(torch.float64) + 0.5) * (1.0 / (1 << 24))
    return exact.gumbel(u)


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
    is_any_filtered: bool | None = None  # any row with top_k > 0 or top_p < 1; None: read it off the rows


SAMPLING_VARIANTS = ((False, False), (True, False), (True, True))  # greedy; sampled; sampled with a filter


def sampling_variant(params) -> tuple[bool, bool]:
    """(is_any_sampled, is_any_filtered) of an iterable of ``SamplingParams``: which sampler a step needs.

    Filtered means a sampled row with top_k > 0 or top_p < 1 (a greedy row's filter is never used).
    """
    is_sampled = is_filtered = False
    for p in params:
        if p.temperature > 0:
            is_sampled = True
            is_filtered = is_filtered or p.top_k > 0 or p.top_p < 1.0
    return is_sampled, is_filtered


# The torch ops' ``_filter_threshold`` (the CPU's; CUDA's with ``FILTER_KERNEL`` off) works through a step's rows in
# chunks of at most this many [rows, V] elements. Its sort, float64 softmax and exact cumulative sum keep, by the
# code's count, some 100 bytes of temporaries per element: at the 8B shape's 128,256-token vocabulary and 1,056 rows
# (a mixed step's largest bucket) about 13 GiB at once. The mixed step's CUDA graphs ran out of memory at capture
# there, asking for 1.01 GiB, the size of 1,056 rows' int64 sort indices (round 53). A chunk of 2^23 elements keeps
# about 1 GiB by the same count. Every value it computes is a function of its own row (a stable sort, exact sums),
# so the chunks cannot show in the bits.
FILTER_CHUNK_ELEMENTS = 1 << 23


def _filter_threshold(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """The smallest kept value per row [N, 1] of ``scaled`` [N, V] under top-k / top-p; -inf for a row with neither.

    A row without a filter gets -inf by definition, not by arithmetic, so its
    draw is the same whether or not another row of the batch asked for one.
    The torch ops: the CPU's, and CUDA's with ``FILTER_KERNEL`` off (else
    ``_threshold`` takes the kernel, from the raw logits). On the CPU only the
    rows with a filter are sorted (a step with one top-p row among a thousand
    sorts one row), in chunks of ``FILTER_CHUNK_ELEMENTS`` (its memory); a row's
    threshold is its own either way.
    """
    num_rows = scaled.shape[0]
    if scaled.is_cuda:  # finding the rows would wait for the device
        return _filter_threshold_chunks(scaled, top_k, top_p)
    rows = ((top_k > 0) | (top_p < 1.0)).nonzero().squeeze(1)
    if len(rows) == num_rows:
        return _filter_threshold_chunks(scaled, top_k, top_p)
    threshold = scaled.new_full((num_rows, 1), float("-inf"))
    if len(rows):
        threshold[rows] = _filter_threshold_chunks(scaled[rows], top_k[rows], top_p[rows])
    return threshold


def _filter_threshold_chunks(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """``_filter_threshold`` of every row of ``scaled``, ``FILTER_CHUNK_ELEMENTS`` at a time."""
    rows = max(1, FILTER_CHUNK_ELEMENTS // scaled.shape[-1])
    if scaled.shape[0] <= rows:
        return _filter_threshold_rows(scaled, top_k, top_p)
    return torch.cat([_filter_threshold_rows(scaled[i: i + rows], top_k[i: i + rows], top_p[i: i + rows])
                      for i in range(0, scaled.shape[0], rows)])


def _filter_threshold_rows(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """``_filter_threshold`` of one chunk of rows, all at once."""
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
    threshold = torch.maximum(sorted_vals.gather(1, (num_keep - 1)[:, None]), kth)
    is_filtered = (top_k > 0) | (top_p < 1.0)
    return torch.where(is_filtered[:, None], threshold, float("-inf"))


def _greedy_and_logprob_parts(logits: torch.Tensor, *, runner_up: bool = False, row_min: bool = False):
    """(argmax [N], row max [N], log of the sum of exp(x - max) [N]): the raw log-prob is (x - max) - that.

    ``runner_up=True`` appends each row's second largest logit (float32 [N]), ``row_min=True`` its smallest
    (float32 [N]), in that order."""
    if logits.is_cuda:
        from llm42.kernels.sampling import row_stats

        greedy, row_max, sumexp, *rest = row_stats(logits, runner_up=runner_up, row_min=row_min)
        return (greedy, row_max, torch.log(sumexp), *rest)
    x64 = logits.double()
    row_max = x64.amax(-1, keepdim=True)
    log_sum = exact._log64_of_positive(exact._row_sum_(exact.exp64(x64 - row_max)))
    greedy = torch.argmax(logits, dim=-1)
    rest = ((_second(logits, greedy),) if runner_up else ()) + ((logits.amin(-1).float(),) if row_min else ())
    return (greedy, row_max.squeeze(-1), log_sum, *rest)


def _second(values: torch.Tensor, winner: torch.Tensor) -> torch.Tensor:
    """Each row's largest value at an index other than ``winner`` (float32 [N]; -inf for a row of one)."""
    others = values.float().scatter(1, winner[:, None], float("-inf"))
    return others.amax(-1)


def _draw(scaled: torch.Tensor, threshold: torch.Tensor | None, rows: SamplingRows, *, runner_up: bool = False,
          scale: tuple[torch.Tensor, torch.Tensor] | None = None):
    """Gumbel-max over the kept tokens of each row; ``runner_up=True``: (tokens, winning score, runner-up).

    ``scale=(row_max, row_min)`` (CUDA): ``scaled`` holds the raw logits, which the kernel scales by the rows'
    temperatures as ``_scaled`` does (the same bits); with ``kernels.sampling.GUMBEL_SKIP_GREEDY`` greedy rows
    draw nothing there (the caller takes their greedy token and margin)."""
    if scaled.is_cuda:
        from llm42.kernels import sampling

        return sampling.gumbel_argmax(scaled, threshold, noise_keys(rows.seeds, rows.positions), runner_up=runner_up,
                                      scale=None if scale is None else (rows.temperature, *scale),
                                      sampled_only=scale is not None and sampling.GUMBEL_SKIP_GREEDY)
    assert scale is None, "scale= is the CUDA kernel's"
    if threshold is not None:
        scaled = torch.where(scaled >= threshold, scaled, float("-inf"))
    scores = scaled + gumbel_noise(rows.seeds, rows.positions, scaled.shape[-1])
    tokens = torch.argmax(scores, dim=-1)
    if runner_up:
        return tokens, scores.gather(1, tokens[:, None]).squeeze(1).float(), _second(scores, tokens)
    return tokens


def _scaled(logits: torch.Tensor, rows: SamplingRows, row_max: torch.Tensor) -> torch.Tensor:
    """``logits / temperature`` [N, V] float32 (greedy rows scaled by 1).

    A tiny temperature (1e-40) overflows logits / T to inf: such a row takes
    (logits - max) / T, the same draw kept finite; every other row keeps its
    bits. Division is monotone, so a row overflows exactly when its largest
    |logit| does: decided from [N] values, with no [N, V] test.
    """
    temperature = torch.where(rows.temperature > 0, rows.temperature, 1.0)[:, None]
    scaled = logits / temperature
    max32 = row_max.float()[:, None]  # a float32 logit (held in float64 on the CPU), exactly
    abs_max = torch.maximum(max32, -logits.amin(-1, keepdim=True))
    is_overflow = torch.isinf(abs_max / temperature) & torch.isfinite(abs_max)
    return torch.where(is_overflow, (logits - max32) / temperature, scaled)


def _threshold(logits: torch.Tensor, scaled: torch.Tensor, rows: SamplingRows, row_max: torch.Tensor,
               row_min: torch.Tensor | None = None) -> torch.Tensor:
    """Each row's top-k / top-p threshold on ``scaled`` (the rows' ``_scaled`` values of the raw ``logits``): on
    CUDA with ``FILTER_KERNEL`` the kernel's, from the raw logits (``row_max``, ``row_min``: theirs); else the torch
    ops' (``_filter_threshold``) on ``scaled``. [N, 1], for a comparison with ``scaled``."""
    if logits.is_cuda and FILTER_KERNEL:
        from llm42.kernels.sampling import filter_threshold

        row_min = logits.amin(-1) if row_min is None else row_min
        return filter_threshold(logits, rows.temperature, row_max, row_min, rows.top_k, rows.top_p)[:, None]
    return _filter_threshold(scaled, rows.top_k, rows.top_p)


def processed_scores(logits: torch.Tensor, rows: SamplingRows) -> torch.Tensor:
    """``logits / temperature`` restricted to the top-k / top-p support ([N, V] float32, -inf outside it).

    Greedy rows are scaled by 1; the sampler never reads them from here.
    """
    row_max = logits.amax(-1)
    scaled = _scaled(logits, rows, row_max)
    return torch.where(scaled >= _threshold(logits, scaled, rows, row_max), scaled, float("-inf"))


def sample(logits: torch.Tensor, rows: SamplingRows) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row; returns (tokens [N] int64, log-probs [N] float32 of the raw distribution).

    The raw log-prob of token t is (x_t - max) - log(sum exp(x - max)): on the
    CPU in float64 from exact primitives, rounded once (the value of
    ``exact.log_softmax``); on CUDA from the row-statistics kernel, in float32.
    """
    tokens, logprobs, _ = _sample(logits, rows, with_margins=False)
    return tokens, logprobs


def sample_with_margins(logits: torch.Tensor, rows: SamplingRows
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``sample``'s (tokens, log-probs), the same bits, and each row's *margin* (float32 [N]).

    The margin is how far the choice was from going to another token, in logits: a greedy row's
    largest logit minus its second largest; a sampled row's winning Gumbel-max score minus the
    runner-up's, times the temperature (a logit moved by d moves a score by d / T). Numerics that
    move every logit by less than half the margin cannot change the token; so a fast-path draft
    with a small margin is the one the canonical pass is likely to reject. (A top-k / top-p row's
    margin is taken over its kept tokens: a change of the kept set is not measured.)
    """
    return _sample(logits, rows, with_margins=True)


def _sample(logits: torch.Tensor, rows: SamplingRows, *, with_margins: bool):
    is_sampled = rows.temperature > 0
    is_any_sampled = rows.is_any_sampled if rows.is_any_sampled is not None else bool(is_sampled.any())
    is_any_filtered = False
    if is_any_sampled:
        is_any_filtered = rows.is_any_filtered
        if is_any_filtered is None:
            is_any_filtered = bool(((rows.top_k > 0) | (rows.top_p < 1.0)).any())
    # The row statistics read the logits as the head wrote them, on every path: on CUDA the sum of exponentials is
    # a reduction whose order follows the kernel's load layout, which follows the dtype (a float32 copy would give
    # other bits). The fused CUDA sampler (FUSED_CUDA_SAMPLER) scales them in the Gumbel kernel too, and in the
    # top-k / top-p threshold's kernel (FILTER_KERNEL); the torch filter sorts scaled values, so without that kernel
    # a step with a top-k / top-p row makes them from a float32 copy (the same values, exactly).
    fused = logits.is_cuda and FUSED_CUDA_SAMPLER and (FILTER_KERNEL or not is_any_filtered)
    parts = _greedy_and_logprob_parts(logits, runner_up=with_margins, row_min=fused and is_any_sampled)
    greedy, row_max, log_sum = parts[:3]
    margins = (row_max.float() - parts[3]) if with_margins else None
    if is_any_sampled:
        if fused:
            scaled, scale = logits, (row_max, parts[-1])
            threshold = _threshold(logits, logits, rows, row_max, parts[-1]) if is_any_filtered else None
        else:
            scaled, scale = _scaled(logits.float(), rows, row_max), None
            threshold = _threshold(logits, scaled, rows, row_max) if is_any_filtered else None
        if with_margins:
            drawn, best, second = _draw(scaled, threshold, rows, runner_up=True, scale=scale)
            margins = torch.where(is_sampled, (best - second) * rows.temperature, margins)
        else:
            drawn = _draw(scaled, threshold, rows, scale=scale)
        tokens = torch.where(is_sampled, drawn, greedy)
    else:
        tokens = greedy
    chosen = logits.gather(1, tokens[:, None]).squeeze(1).float()
    if logits.is_cuda:
        return tokens, (chosen - row_max) - log_sum, margins
    return tokens, ((chosen.double() - row_max) - log_sum).float(), margins


def logprob_details(logits: torch.Tensor, tokens: torch.Tensor, rows: SamplingRows, is_processed: torch.Tensor | None,
                    num_top: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-probs of ``tokens`` and each row's ``num_top`` most likely tokens, raw or processed per row.

    logits: [N, V]; tokens: [N] int64 (sampled, or given when scoring); is_processed: [N] bool, or None
    when no row is processed (the caller knows it on the host: no device sync here).
    A raw row's distribution is ``log_softmax(logits)`` (the bits ``sample`` returns); a processed
    row's is the one ``sample`` draws from: ``log_softmax`` over the top-k / top-p support of
    ``logits / temperature``, or for a greedy row probability 1 on ``tokens`` (log-prob 0) and 0
    elsewhere. Returns (log-probs [N] float32, top ids [N, num_top] int64, top log-probs
    [N, num_top] float32), the top ones ordered by log-prob, then by token id (a stable sort, so the
    order is a function of the row alone); entries of probability 0 hold -inf.
    """
    _, row_max, log_sum = _greedy_and_logprob_parts(logits)  # as ``sample`` reads them: the same bits
    logits = logits.float()
    if logits.is_cuda:  # the raw log-probs, elementwise as ``sample`` computes the chosen one
        logprobs_all = (logits - row_max[:, None]) - log_sum[:, None]
    else:
        logprobs_all = ((logits.double() - row_max[:, None]) - log_sum[:, None]).float()
    if is_processed is not None:
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
