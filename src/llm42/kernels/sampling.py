"""The sampler's vocabulary sweeps on CUDA, in Triton: row statistics, Gumbel-max and the top-k / top-p threshold.

``llm42.sampler`` on the CPU builds its log-probs and noise from
``llm42.ops.exact`` (order-independent float64 arithmetic). On the GPU that
costs dozens of float64 passes over an [N, V] tensor per step (over 2 ms at
N = 256, V = 49K on an H200, more than the whole decode step). These kernels
read the logits once each instead: one program per row, looping over the
vocabulary in blocks of a fixed size with a fixed number of warps, so a row's
reduction order is a function of V alone — never of how many rows there are,
which row it is, or what the other rows hold. That is the property the
contract needs from the sampler on the device (the canonical pass and the fast
path sample with the same code, so candidates and canonical tokens see the same
noise); the bits differ from the CPU's, as every GPU op's do (the device is part
of the canonical config).

- ``row_stats(logits)`` -> (argmax, max, sum of exp(x - max)) per row, one pass
  with an online rescale (FlashAttention's): the greedy token (first index of
  the max, as ``torch.argmax``) and what the chosen token's log-prob needs.
- ``gumbel_argmax(scaled, threshold, keys)`` -> argmax(scaled + g) over the
  tokens with ``scaled >= threshold``, g = -log(-log(u)) and u from the same
  counter-based hash of (row key, vocab id) as ``llm42.sampler.gumbel_noise``
  (23 random bits here, so that u is exact in float32).

- ``filter_threshold(logits, ...)`` -> each row's top-k / top-p threshold on the
  scaled logits, by a search over the keys of its values (a few reads of the
  row, no sort; each read split over programs of a few blocks each), for
  ``gumbel_argmax``'s ``threshold``.

Either sweep can also return each row's *runner-up* (``runner_up=True``): the
second largest value it took the maximum over (the max itself again on a tie).
The fast path's sampler reads a draft's margin off it (``llm42.sampler``); the
winner and every other output are the same bits with or without it.

Both read the logits in whatever dtype the output head wrote them (bf16 on the
model's path; widening to float32 is exact). The sum of exponentials is the one
result whose bits depend on that dtype: its reduction order follows the load's
layout, which Triton picks by the element size (round 50's first GPU run: a
float32 copy of bf16 logits gave the same tokens and other log-probs; max,
argmax and runner-up are exact either way). So the sampler hands every path's
row statistics the head's logits as they are. ``gumbel_argmax`` can also scale
them itself (``scale=(temperature, row_max, row_min)``): each element is
``div_rn(x - shift, T)`` with the row's ``shift`` = its max where ``|max| / T``
overflows, else 0 (IEEE division: the bits of the torch ops
``llm42.sampler._scaled`` runs on a float32 copy). The sampler on CUDA then
reads the [N, V] logits twice instead of making a float32 copy and a scaled
one (about a dozen float32 passes over [N, V] per sampled step).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Pinned launch configuration: part of what a row's bits depend on (never autotuned).
BLOCK_V = 2048
NUM_WARPS = 8
# Programs the Gumbel sweep aims for: N splits each row's vocabulary into whole blocks over about N / rows programs,
# then merges their winners; None keeps one program per row. Exact either way (a max, the first index among equal
# maxima, and the runner-up merge in any order), so the bits are the same at every split; a launch choice for the
# sweep's latency (one program per row is 64 programs at 64 rows). Measured on an H100 (round 51, with
# GUMBEL_SKIP_GREEDY): 0.69-0.84x the one-program sweep's time on half-greedy steps, 0.75-0.99x on all-sampled
# ones (benchmarks/device/sampler_ab.py), the 8B shape's nondet 1.005x (ABBA), SmolLM2's 1.012x; the default since.
GUMBEL_TARGET_PROGRAMS: int | None = 1024
# The sampler's fused sweep skips greedy rows (``gumbel_argmax(sampled_only=True)``: their draw is never taken; the
# benchmarks' requests are half greedy). The same bits for every sampled row. Alone it measured 1.0-1.1x slower on an
# H100 (round 51: a row's one program still runs); with the split above it is what makes half-greedy steps cheap.
GUMBEL_SKIP_GREEDY = True
# The top-k / top-p threshold's search (``filter_threshold``): pivots per pass over a row, the block a pass reads at
# a time, and the warps of a program (four elements a thread, each with a running sum per pivot). Pinned, like
# BLOCK_V: a row's sums follow them. Four pivots (eight passes on bf16 logits) against sixteen (four passes), on an
# H100 (round 56, sampler_ab.py --filtered): 0.64x / 0.69x the time with every row of 1,056 filtered (8B / SmolLM2
# vocabulary), 0.72x / 0.91x at 256 rows, 1.08x / 0.99x at 64, one top-p row the same (0.92 against 0.96 ms at
# 1,056 rows); served, the 8B shape with 400 top-p requests 1.013x.
FILTER_FAN = 4
FILTER_BLOCK = 1024
FILTER_WARPS = 8
# A row's search is split over programs of this many blocks each (None: one program per row), its chunks' sums added
# in chunk order: a row's bits follow it too. One program per row left a step with a single top-p row on one SM
# (round 55: 1.5 ms at the 8B vocabulary against 0.72 ms without a filter).
FILTER_CHUNK_BLOCKS: int | None = 8


@triton.jit
def _top_two(second, m, vals, idx, block_max, block_arg):
    """The runner-up after merging a block into a running (max ``m``, runner-up ``second``): the block's own
    runner-up is its largest value at an index other than its argmax."""
    block_second = tl.max(tl.where(idx == block_arg, float("-inf"), vals), 0)
    return tl.maximum(tl.maximum(second, block_second), tl.minimum(m, block_max))


@triton.jit
def _row_stats_kernel(x_ptr, stride_x, vocab: tl.constexpr, argmax_ptr, max_ptr, sumexp_ptr, second_ptr, min_ptr,
                      RUNNER_UP: tl.constexpr, ROW_MIN: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = x_ptr + row * stride_x
    offs = tl.arange(0, BLOCK)
    m = tl.full((), float("-inf"), tl.float32)
    s = tl.zeros((), tl.float32)
    second = tl.full((), float("-inf"), tl.float32)
    lo = tl.full((), float("inf"), tl.float32)
    best = tl.zeros((), tl.int32)
    for start in range(0, vocab, BLOCK):
        idx = start + offs
        x = tl.load(base + idx, mask=idx < vocab, other=float("-inf")).to(tl.float32)
        if ROW_MIN:
            lo = tl.minimum(lo, tl.min(tl.where(idx < vocab, x, float("inf")), 0))
        block_max = tl.max(x, 0)
        block_arg = tl.argmax(x, 0, tie_break_left=True).to(tl.int32) + start
        if RUNNER_UP:
            second = _top_two(second, m, x, idx, block_max, block_arg)
        best = tl.where(block_max > m, block_arg, best)  # strict: the first index of the max wins
        m_new = tl.maximum(m, block_max)
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row of -inf so far: subtract 0, not -inf
        s = s * tl.exp(m - m_sub) + tl.sum(tl.exp(x - m_sub), 0)
        m = m_new
    tl.store(argmax_ptr + row, best.to(tl.int64))
    tl.store(max_ptr + row, m)
    tl.store(sumexp_ptr + row, s)
    if RUNNER_UP:
        tl.store(second_ptr + row, second)
    if ROW_MIN:
        tl.store(min_ptr + row, lo)


@triton.jit
def _row_scale(temperature, row_max, row_min):
    """(T, shift) of a row, ``llm42.sampler._scaled``'s: an element is scaled as div_rn(x - shift, T); a greedy row
    (T <= 0) by 1; shift is the row's max where |max| / T overflows, else 0 (x - 0.0 is x, bit for bit)."""
    temperature = tl.where(temperature > 0, temperature, 1.0)
    abs_max = tl.maximum(row_max, -row_min, propagate_nan=tl.PropagateNan.ALL)
    overflows = (tl.abs(tl.math.div_rn(abs_max, temperature)) == float("inf")) & (tl.abs(abs_max) < float("inf"))
    return temperature, tl.where(overflows, row_max, 0.0)


@triton.jit
def _mix32(x):
    x = ((x >> 16) ^ x) * 0x45D9F3B
    x = ((x >> 16) ^ x) * 0x45D9F3B
    return (x >> 16) ^ x


@triton.jit
def _gumbel_block(best_val, second, best, start, base, offs, key, threshold, shift, temperature, vocab: tl.constexpr,
                  HAS_THRESHOLD: tl.constexpr, RUNNER_UP: tl.constexpr, SCALE: tl.constexpr):
    # one block of the sweep merged into the running (winning value, runner-up, winner)
    idx = start + offs
    in_vocab = idx < vocab
    x = tl.load(base + idx, mask=in_vocab, other=float("-inf")).to(tl.float32)
    if SCALE:
        x = tl.math.div_rn(x - shift, temperature)
    bits = _mix32(_mix32(key ^ (idx.to(tl.uint32) * 0x27D4EB2F)) ^ 0x165667B1)
    u = ((bits >> 9).to(tl.float32) * 2.0 + 1.0) * (1.0 / (1 << 24))  # (0, 1), exact in float32
    val = x - tl.log(-tl.log(u))
    keep = in_vocab
    if HAS_THRESHOLD:
        keep = keep & (x >= threshold)
    val = tl.where(keep, val, float("-inf"))
    block_max = tl.max(val, 0)
    block_arg = tl.argmax(val, 0, tie_break_left=True).to(tl.int32) + start
    if RUNNER_UP:
        second = _top_two(second, best_val, val, idx, block_max, block_arg)
    best = tl.where(block_max > best_val, block_arg, best)
    best_val = tl.maximum(best_val, block_max)
    return best_val, second, best


@triton.jit
def _gumbel_argmax_kernel(x_ptr, stride_x, vocab: tl.constexpr, threshold_ptr, key_ptr, out_ptr, best_ptr, second_ptr,
                          temperature_ptr, max_ptr, min_ptr, chunk_blocks, HAS_THRESHOLD: tl.constexpr,
                          RUNNER_UP: tl.constexpr, SCALE: tl.constexpr, SAMPLED_ONLY: tl.constexpr,
                          CHUNKED: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = x_ptr + row * stride_x
    offs = tl.arange(0, BLOCK)
    key = tl.load(key_ptr + row).to(tl.uint32)
    threshold = 0.0
    if HAS_THRESHOLD:
        threshold = tl.load(threshold_ptr + row)
    end = vocab
    temperature = 1.0
    shift = 0.0
    if SCALE:  # llm42.sampler._scaled's arithmetic, per element: a greedy row (T = 0) is scaled by 1
        temperature = tl.load(temperature_ptr + row)
        if SAMPLED_ONLY:  # a greedy row draws nothing (the sampler takes its greedy token)
            end = tl.where(temperature > 0, vocab, 0)
        temperature, shift = _row_scale(temperature, tl.load(max_ptr + row), tl.load(min_ptr + row))
    best_val = tl.full((), float("-inf"), tl.float32)
    second = tl.full((), float("-inf"), tl.float32)
    best = tl.zeros((), tl.int32)
    if CHUNKED:
        # program (row, chunk) sweeps the row's blocks [chunk * chunk_blocks, (chunk + 1) * chunk_blocks) and
        # stores its winner at [row, chunk] of [N, num_chunks] buffers, for _gumbel_merge_kernel
        chunk = tl.program_id(1)
        lo = chunk * chunk_blocks * BLOCK
        for start in range(lo, tl.minimum(lo + chunk_blocks * BLOCK, end), BLOCK):
            best_val, second, best = _gumbel_block(best_val, second, best, start, base, offs, key, threshold, shift,
                                                   temperature, vocab, HAS_THRESHOLD, RUNNER_UP, SCALE)
        at = row * tl.num_programs(1) + chunk
        tl.store(out_ptr + at, best.to(tl.int64))
        tl.store(best_ptr + at, best_val)
        if RUNNER_UP:
            tl.store(second_ptr + at, second)
    else:
        for start in range(0, end, BLOCK):
            best_val, second, best = _gumbel_block(best_val, second, best, start, base, offs, key, threshold, shift,
                                                   temperature, vocab, HAS_THRESHOLD, RUNNER_UP, SCALE)
        tl.store(out_ptr + row, best.to(tl.int64))
        if RUNNER_UP:
            tl.store(best_ptr + row, best_val)
            tl.store(second_ptr + row, second)


@triton.jit
def _gumbel_merge_kernel(idx_ptr, val_ptr, second_ptr, num_chunks, out_ptr, best_ptr, second_out_ptr,
                         RUNNER_UP: tl.constexpr, BLOCK_C: tl.constexpr):
    # a row's chunk winners, in vocabulary order: the largest value, the first chunk holding it (so the first
    # index among equal maxima, as one sweep keeps), and the runner-up: that chunk's own, or another chunk's winner
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_C)
    mask = offs < num_chunks
    vals = tl.load(val_ptr + row * num_chunks + offs, mask=mask, other=float("-inf"))
    best_val = tl.max(vals, 0)
    winner = tl.min(tl.where(vals == best_val, offs, BLOCK_C), 0)  # the first chunk at the max, explicitly
    winner = tl.minimum(winner, num_chunks - 1)  # (NaN values match nothing: never a load past the row)
    tl.store(out_ptr + row, tl.load(idx_ptr + row * num_chunks + winner))
    if RUNNER_UP:
        own = tl.load(second_ptr + row * num_chunks + winner)
        others = tl.max(tl.where(offs == winner, float("-inf"), vals), 0)
        tl.store(best_ptr + row, best_val)
        tl.store(second_out_ptr + row, tl.maximum(own, others))


@triton.jit
def _key(x, GRAIN: tl.constexpr):
    """An int32 key of float32 ``x`` in the floats' order (-0 as +0), without the low ``GRAIN`` bits (zero in every
    value of the input's dtype: 16 for bf16, 13 for fp16), so that a search over keys takes fewer passes."""
    bits = tl.where(x == 0.0, 0.0, x).to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits) >> GRAIN


@triton.jit
def _unkey(key, GRAIN: tl.constexpr):
    """The float32 whose ``_key`` is ``key``."""
    key = key.to(tl.int32)
    full = (key << GRAIN) | tl.where(key < 0, (1 << GRAIN) - 1, 0)
    return tl.where(full < 0, full ^ 0x7FFFFFFF, full).to(tl.float32, bitcast=True)


@triton.jit
def _row_block(base, start, offs, vocab: tl.constexpr):
    """One block of a row as float32 (-inf past its end), and which of it is in the vocabulary."""
    idx = start + offs
    in_vocab = idx < vocab
    return tl.load(base + idx, mask=in_vocab, other=float("-inf")).to(tl.float32), in_vocab


@triton.jit
def _weight(x, row_max, rate):
    """A logit's weight in the top-p mass, exp((x - max) / T) in float32 as exp2((x - max) * rate), rate =
    log2(e) / T: no division per value; the max weighs 1 even where the rate overflows (T tiny)."""
    return tl.where(x == row_max, 1.0, tl.exp2((x - row_max) * rate))


@triton.jit
def _chunk_sums(base, offs, begin, end, lo, hi, row_max, rate, vocab: tl.constexpr, GRAIN: tl.constexpr,
                FAN: tl.constexpr, BLOCK: tl.constexpr, BY_MASS: tl.constexpr):
    """One pass of the search over values [begin, end) of a row: per pivot (FAN of them, evenly over the keys
    [lo, hi]), the count (top-k) or the weight (top-p, ``BY_MASS``) of the values whose keys are at or above it;
    summed per lane of the block, and across lanes once at the end (a count is exact in float32 up to 2^24)."""
    step = (hi - lo) // FAN + 1
    pivots32 = (lo + step * tl.arange(0, FAN).to(tl.int64)).to(tl.int32)  # each within a key's range plus FAN
    lanes = tl.zeros([BLOCK, FAN], tl.float32)
    for start in range(begin, end, BLOCK):
        x, in_vocab = _row_block(base, start, offs, vocab)
        at_or_above = (_key(x, GRAIN)[:, None] >= pivots32[None, :]) & in_vocab[:, None]
        if BY_MASS:
            lanes += tl.where(at_or_above, _weight(x, row_max, rate)[:, None], 0.0)
        else:
            lanes += at_or_above.to(tl.float32)
    return tl.sum(lanes, 0)


@triton.jit
def _filter_pass_kernel(x_ptr, stride_x, vocab: tl.constexpr, temperature_ptr, max_ptr, min_ptr, top_k_ptr,
                        top_p_ptr, lo_ptr, hi_ptr, total_ptr, part_ptr, out_ptr, num_rows, num_chunks, slot,
                        PREV: tl.constexpr, THIS: tl.constexpr, GRAIN: tl.constexpr, FAN: tl.constexpr,
                        BLOCK: tl.constexpr, CHUNK: tl.constexpr):
    # One launch of the threshold's search; program (row, chunk) covers the row's values [chunk * CHUNK, ...).
    # Every program first takes the row's search state a step further from what the launch before left (the state
    # at ``1 - slot``: the interval its pivots spanned, and its chunks' sums at [1 - slot, row, :, :], added in chunk
    # order), each the same way, so all hold the same state; chunk 0 stores it at ``slot``. Then its own part of
    # this launch's work, its sums at [slot, row, chunk, :]. PREV / THIS: 0 nothing (the search's start), 1 a top-k
    # pass (counts), 2 the mass of the k largest values, 3 a top-p pass (weights), 4 the threshold itself.
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    base = x_ptr + row * stride_x
    offs = tl.arange(0, BLOCK)
    fan = tl.arange(0, FAN)
    raw_temperature = tl.load(temperature_ptr + row)
    row_max = tl.load(max_ptr + row)
    row_min = tl.load(min_ptr + row)
    top_k = tl.load(top_k_ptr + row)
    top_p = tl.load(top_p_ptr + row)
    temperature, shift = _row_scale(raw_temperature, row_max, row_min)
    active = (raw_temperature > 0) & ((top_k > 0) | (top_p < 1.0)) & (row_max > float("-inf"))
    rate = 1.4426950408889634 / temperature
    has_k = active & (top_k > 0) & (top_k < vocab)
    k_then_p = has_k & (top_p < 1.0)

    if PREV == 0:  # the top-k search's interval: the row's keys (none without top-k)
        lo = _key(row_min, GRAIN).to(tl.int64)
        hi = tl.where(has_k, _key(row_max, GRAIN).to(tl.int64), lo)
        total = -1.0
    else:
        before = (1 - slot) * num_rows + row
        lo = tl.load(lo_ptr + before)
        hi = tl.load(hi_ptr + before)
        total = tl.load(total_ptr + before)
        sums = part_ptr + before * num_chunks * FAN
        if PREV == 2:
            # the mass the top-p search measures against: with top-k, that of the k largest logits (ties at the
            # k-th counted up to k); without, the whole row's (-1 here: the first top-p pass's pivot 0, the row's
            # minimum, weighs it). The top-p interval: the k-th logit (or the minimum) up to the max.
            if k_then_p:
                mass = 0.0
                count = 0.0
                for c in range(num_chunks):
                    mass += tl.load(sums + c * FAN)
                    count += tl.load(sums + c * FAN + 1)
                kth_weight = _weight(_unkey(lo, GRAIN), row_max, rate)
                total = mass + (top_k.to(tl.float32) - count) * kth_weight
            hi = tl.where(active & (top_p < 1.0), _key(row_max, GRAIN).to(tl.int64), lo)
        else:
            if lo < hi:  # the pass before ran: narrow the interval to the largest pivot that holds
                acc = tl.zeros([FAN], tl.float32)
                for c in range(num_chunks):
                    acc += tl.load(sums + c * FAN + fan)
                step = (hi - lo) // FAN + 1
                pivots = lo + step * fan.to(tl.int64)
                if PREV == 3:
                    total = tl.where(total < 0, tl.sum(tl.where(fan == 0, acc, 0.0), 0), total)
                    holds = (acc >= top_p * total) | (fan == 0)
                else:
                    holds = acc >= top_k.to(tl.float32)
                lo = lo + tl.max(tl.where(holds & (pivots <= hi), fan, 0), 0).to(tl.int64) * step
                hi = tl.minimum(hi, lo + step - 1)
    if chunk == 0:
        tl.store(lo_ptr + slot * num_rows + row, lo)
        tl.store(hi_ptr + slot * num_rows + row, hi)
        tl.store(total_ptr + slot * num_rows + row, total)

    begin = chunk * CHUNK
    end = tl.minimum(begin + CHUNK, vocab)
    here = part_ptr + ((slot * num_rows + row) * num_chunks + chunk) * FAN
    if THIS == 4:  # in the scaled values the Gumbel kernel compares it with (``_scaled``'s bits)
        threshold = tl.math.div_rn(_unkey(lo, GRAIN) - shift, temperature)
        tl.store(out_ptr + row, tl.where(active, threshold, float("-inf")))
    elif THIS == 2:  # the weight and the count of the values above the k-th
        if k_then_p:
            kth_key = lo.to(tl.int32)
            mass_above = tl.zeros([BLOCK], tl.float32)
            count_above = tl.zeros([BLOCK], tl.float32)
            for start in range(begin, end, BLOCK):
                x, in_vocab = _row_block(base, start, offs, vocab)
                above = (_key(x, GRAIN) > kth_key) & in_vocab
                mass_above += tl.where(above, _weight(x, row_max, rate), 0.0)
                count_above += above.to(tl.float32)
            tl.store(here + fan, tl.where(fan == 0, tl.sum(mass_above, 0), tl.sum(count_above, 0)), mask=fan < 2)
    else:
        if lo < hi:
            tl.store(here + fan, _chunk_sums(base, offs, begin, end, lo, hi, row_max, rate, vocab, GRAIN, FAN, BLOCK,
                                             THIS == 3))


def _rows(logits: torch.Tensor) -> torch.Tensor:
    if logits.dim() != 2:
        raise ValueError(f"logits must be [N, V], got shape {tuple(logits.shape)}")
    return logits if logits.stride(-1) == 1 else logits.contiguous()


def row_stats(logits: torch.Tensor, *, runner_up: bool = False, row_min: bool = False):
    """(argmax int64 [N], max float32 [N], sum of exp(x - max) float32 [N]) of ``logits`` [N, V] (any float
    dtype, read as float32); ``runner_up=True`` appends each row's second largest logit, ``row_min=True`` its
    smallest (float32 [N] each, in that order)."""
    x = _rows(logits)
    num_rows, vocab = x.shape
    argmax = torch.empty(num_rows, dtype=torch.int64, device=x.device)
    row_max = torch.empty(num_rows, dtype=torch.float32, device=x.device)
    sumexp = torch.empty(num_rows, dtype=torch.float32, device=x.device)
    second = torch.empty(num_rows, dtype=torch.float32, device=x.device) if runner_up else row_max
    low = torch.empty(num_rows, dtype=torch.float32, device=x.device) if row_min else row_max
    if num_rows:
        _row_stats_kernel[(num_rows,)](x, x.stride(0), vocab, argmax, row_max, sumexp, second, low,
                                       RUNNER_UP=runner_up, ROW_MIN=row_min, BLOCK=BLOCK_V, num_warps=NUM_WARPS)
    return (argmax, row_max, sumexp) + ((second,) if runner_up else ()) + ((low,) if row_min else ())


def gumbel_argmax(scaled: torch.Tensor, threshold: torch.Tensor | None, keys: torch.Tensor, *,
                  runner_up: bool = False,
                  scale: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None, sampled_only: bool = False):
    """argmax over v of scaled[i, v] + g(keys[i], v), among v with scaled[i, v] >= threshold[i] (if given).

    ``scale=(temperature, row_max, row_min)`` (float32 [N] each; ``row_stats``' max and min of these logits):
    ``scaled`` holds the raw logits, and the kernel scales each element as ``llm42.sampler._scaled`` would
    (the same bits; the threshold, if any, applies to the scaled values); with ``sampled_only=True`` a row of
    temperature <= 0 reads nothing and draws token 0 at -inf (what the sampler never takes: its greedy token).
    With ``runner_up=True``: (argmax, the winning value, the second largest value) per row."""
    if sampled_only and scale is None:
        raise ValueError("gumbel_argmax: sampled_only=True needs scale= (the rows' temperatures)")
    x = _rows(scaled)
    num_rows, vocab = x.shape
    chunk_blocks, num_chunks = gumbel_chunks(num_rows, vocab)
    shape = (num_rows, num_chunks) if num_chunks > 1 else (num_rows,)  # one chunk: the results themselves
    out = torch.empty(shape, dtype=torch.int64, device=x.device)
    best = torch.empty(shape, dtype=torch.float32, device=x.device) if runner_up or num_chunks > 1 else None
    second = torch.empty(shape, dtype=torch.float32, device=x.device) if runner_up else None
    if scale is not None:
        scale = tuple(t.reshape(num_rows).float().contiguous() for t in scale)
    if num_rows:
        thr = threshold.reshape(num_rows).float().contiguous() if threshold is not None else x
        temperature, row_max, row_min = scale if scale is not None else (x, x, x)
        _gumbel_argmax_kernel[(num_rows, num_chunks)](
            x, x.stride(0), vocab, thr, keys.contiguous(), out, out if best is None else best,
            out if second is None else second, temperature, row_max, row_min, chunk_blocks,
            HAS_THRESHOLD=threshold is not None, RUNNER_UP=runner_up, SCALE=scale is not None,
            SAMPLED_ONLY=sampled_only, CHUNKED=num_chunks > 1, BLOCK=BLOCK_V, num_warps=NUM_WARPS)
    if num_chunks > 1:
        merged = torch.empty(num_rows, dtype=torch.int64, device=x.device)
        merged_best = torch.empty(num_rows, dtype=torch.float32, device=x.device) if runner_up else None
        merged_second = torch.empty(num_rows, dtype=torch.float32, device=x.device) if runner_up else None
        if num_rows:
            _gumbel_merge_kernel[(num_rows,)](out, best, best if second is None else second, num_chunks, merged,
                                              merged if merged_best is None else merged_best,
                                              merged if merged_second is None else merged_second,
                                              RUNNER_UP=runner_up, BLOCK_C=triton.next_power_of_2(num_chunks),
                                              num_warps=1)
        out, best, second = merged, merged_best, merged_second
    return (out, best, second) if runner_up else out


def filter_threshold(logits: torch.Tensor, temperature: torch.Tensor, row_max: torch.Tensor, row_min: torch.Tensor,
                     top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Each row's top-k / top-p threshold (float32 [N]) on the scaled logits ``div_rn(x - shift, T)`` (the values
    ``gumbel_argmax(scale=...)`` compares it with); -inf for a greedy row (T <= 0) and a row with neither filter.

    ``logits`` [N, V] raw (any float dtype, read as float32); ``row_max`` / ``row_min`` their rows' max and min
    (``row_stats``). A logit's weight is exp((x - max) / T), in float32 as exp2((x - max) log2(e) / T). The
    threshold is the k-th largest logit (k = top_k, or V without one), raised to the largest logit t at which the
    logits >= t hold at least ``top_p`` of the k largest logits' weight (ties at the k-th counted up to k): the
    smallest set of the most likely tokens holding p of the mass, and every token tied with its last; returned
    scaled, as ``div_rn(t - shift, T)``, so every token whose scaled value ties it is kept too. Found by searching
    the keys of the row's logits, ``FILTER_FAN`` pivots a pass, each pass one read of the row (a bf16 row: 16-bit
    keys, eight passes of four pivots for top-p): no sort and no [N, V] temporaries. Each pass is one launch over
    (row, chunk) programs of ``filter_chunk(V)`` values each, so a lone filtered row is searched by many SMs;
    every program adds its row's chunk sums in chunk order: the threshold is a function of the row (and V) alone.
    18 launches for bf16 logits, 22 for fp16, 34 for float32 (two searches and two more); a row without a filter
    returns at once from each."""
    x = _rows(logits)
    num_rows, vocab = x.shape
    out = torch.empty(num_rows, dtype=torch.float32, device=x.device)
    if not num_rows:
        return out
    grain = {torch.bfloat16: 16, torch.float16: 13}.get(x.dtype, 0)
    chunk = filter_chunk(vocab)
    num_chunks = triton.cdiv(vocab, chunk)
    as_rows = [t.reshape(num_rows).contiguous() for t in (temperature.float(), row_max.float(), row_min.float(),
                                                         top_k.long(), top_p.float())]
    # the search's state per row (two slots: what one launch reads, what it writes) and each chunk's sums
    lo = torch.empty(2, num_rows, dtype=torch.int64, device=x.device)
    hi = torch.empty_like(lo)
    total = torch.empty(2, num_rows, dtype=torch.float32, device=x.device)
    part = torch.empty(2, num_rows, num_chunks, FILTER_FAN, dtype=torch.float32, device=x.device)
    passes = -(-(32 - grain) // (FILTER_FAN.bit_length() - 1))  # each pass narrows the keys FILTER_FAN-fold
    launches = [(0, 1)] + [(1, 1)] * (passes - 1) + [(1, 2), (2, 3)] + [(3, 3)] * (passes - 1) + [(3, 4)]
    for i, (prev, this) in enumerate(launches):
        grid = (num_rows, 1 if this == 4 else num_chunks)
        _filter_pass_kernel[grid](x, x.stride(0), vocab, *as_rows, lo, hi, total, part, out, num_rows, num_chunks,
                                  i % 2, PREV=prev, THIS=this, GRAIN=grain, FAN=FILTER_FAN, BLOCK=FILTER_BLOCK,
                                  CHUNK=chunk, num_warps=FILTER_WARPS)
    return out


def filter_chunk(vocab: int) -> int:
    """The values of a row one program of ``filter_threshold`` covers: ``FILTER_CHUNK_BLOCKS`` blocks (the whole
    row with None). A function of the vocabulary alone, so a row's sums, added chunk by chunk, are too."""
    blocks = triton.cdiv(vocab, FILTER_BLOCK)
    return FILTER_BLOCK * (blocks if FILTER_CHUNK_BLOCKS is None else min(blocks, FILTER_CHUNK_BLOCKS))


def gumbel_chunks(num_rows: int, vocab: int) -> tuple[int, int]:
    """(vocabulary blocks per program, programs per row) of the Gumbel sweep at ``num_rows`` rows: one program per
    row unless ``GUMBEL_TARGET_PROGRAMS`` asks for more (whole blocks of ``BLOCK_V``; the bits are the same)."""
    blocks = triton.cdiv(vocab, BLOCK_V)
    if GUMBEL_TARGET_PROGRAMS is None or num_rows == 0:
        return blocks, 1
    wanted = min(blocks, max(1, triton.cdiv(GUMBEL_TARGET_PROGRAMS, num_rows)))
    chunk_blocks = triton.cdiv(blocks, wanted)
    return chunk_blocks, triton.cdiv(blocks, chunk_blocks)
