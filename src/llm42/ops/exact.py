"""Order-independent arithmetic: results whose bits cannot depend on layout, row count, threads, ISA or vendor.

A library kernel picks its summation order (and, for transcendentals, its
approximation) from the shape, the memory layout, the thread count and the
instruction set it finds: MKL's sgemm gives a row different bits by its
position on AVX2 or SSE4.2 code paths, ``torch.matmul`` copies a permuted
operand for some batch sizes and not others, and ``torch.exp`` / ``sigmoid``
round differently in a loop's vectorized body and its scalar tail. Everything
here is built so that none of that can matter:

- **Sums are exact.** Each operand row is scaled by a power of two from its
  own max-abs exponent and cut into integers small enough that every partial
  sum of K products (or of L terms) is exact in float64. An exact sum has one
  value whatever order the library adds in, so a row's result is a function of
  that row's numbers alone (Ozaki-style slicing for GEMMs: the left operand in
  three 12-bit slices, the right one in one slice of 41 - ceil(log2 K) bits,
  so one float64 GEMM of 3M rows; more accurate than float32 BLAS).
- **Everything else is IEEE-exact primitives.** ``+ - * /`` and ``sqrt`` are
  correctly rounded on every vector and scalar path and on every vendor, as
  are ``trunc``, ``round``, ``frexp``, comparisons and casts. ``exp`` and
  ``log`` are range reduction plus a polynomial written as separate torch
  multiply and add ops (no fused op that could contract into an FMA on one
  path and not another), accurate to about one float32 ulp.

The cost is several float64 operations per float32 one; the canonical pass on
the CPU and the sampler (on every device) use it, the fast path does not.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils.weak import WeakIdKeyDictionary

_MANTISSA_BITS = 53  # float64: every integer below 2^53 is exact
# A GEMM's left operand (activations, queries, probabilities: their rows can hold outliers) is cut into
# three 12-bit slices, 36 bits of each row; the right operand (weights, keys, values) into one slice of
# 53 - 12 - ceil(log2 K) bits, rounded: 27 to 35 bits for the model's sizes, which holds a float32 weight
# exactly unless it lies 2^(bits - 24) below its row's max. One slice of the right operand is what keeps
# the cost at one float64 GEMM (weights read once, as 8 bytes); measured, it is 3 to 30 times more accurate
# than float32 BLAS, outliers included (tests/test_cpu_invariance.py).
_ROW_SLICE_BITS = 12
_MIN_COLUMN_BITS = 20


def _fresh64(x: torch.Tensor) -> torch.Tensor:
    # a float64 copy that the in-place steps below may overwrite (never the caller's tensor)
    return x.to(torch.float64, copy=True)


def _scale_(x64: torch.Tensor, dim: int, bits: int, amax: torch.Tensor | None = None) -> torch.Tensor:
    """Scale x64 in place by a power of two s per slice along ``dim`` so that |x64| < 2^bits; returns 1 / s.

    s comes from the slice max's exponent field (bit operations: no pow or
    exp2, whose rounding would be the library's choice), so both products are
    exact. An all-zero slice gets s = 2^1023. ``amax`` (float64, keepdim
    shape): the max-abs to scale by instead of x64's own, when x64 is one
    rank's part of a longer slice (tensor parallelism: the max over all parts).
    """
    if amax is None:
        amax = x64.abs().amax(dim, keepdim=True)
    biased = amax.view(torch.int64) >> 52  # |x| < 2^(biased - 1022)
    scale = ((bits + 2045 - biased).clamp(max=2046) << 52).view(torch.float64)  # 2^(bits - (biased - 1022))
    x64.mul_(scale)
    return torch.reciprocal(scale)


def _ceil_log2(n: int) -> int:
    return max(int(n) - 1, 0).bit_length()


def slice_bits(k: int) -> tuple[int, int]:
    """(β_a, β_b) for a contraction of length k: ``a`` in three β_a-bit slices, ``b`` in one β_b-bit slice.

    Every product of an a-slice and the b-slice is below 2^(β_a + β_b), and k
    of them sum below 2^53: exact in float64, whatever the order.
    """
    column_bits = _MANTISSA_BITS - _ceil_log2(k) - _ROW_SLICE_BITS
    if column_bits < _MIN_COLUMN_BITS:
        raise ValueError(f"a contraction of length {k} is too long for an exact float64 accumulation")
    return _ROW_SLICE_BITS, column_bits


def _split_rows(a: torch.Tensor, row_bits: int, amax: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """a [..., M, K] in three integer slices per row, stacked along M: ([a1; a2; a3] [..., 3M, K], unscale [..., M, 1]).

    a ≈ (a1 + a2 2^-β + a3 2^-2β) · unscale with |a_i| < 2^β: 3β bits of each
    row, relative to its max (the rest, under 2^-3β of it, is dropped).
    """
    num_rows = a.shape[-2]
    stacked = a.new_empty((*a.shape[:-2], 3 * num_rows, a.shape[-1]), dtype=torch.float64)
    rest = stacked[..., 2 * num_rows:, :]
    rest.copy_(a)
    unscale = _scale_(rest, -1, row_bits, amax)
    for i in range(2):
        piece = stacked[..., i * num_rows:(i + 1) * num_rows, :]
        torch.trunc(rest, out=piece)
        rest.sub_(piece).mul_(2.0**row_bits)  # rest - piece is exact: the fraction of a float
    rest.trunc_()
    return stacked, unscale


def split_last(x: torch.Tensor, column_bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] ≈ ints · unscale per vector along the last dim, ints rounded to ``column_bits`` bits.

    The right operand of ``product`` (transposed: its columns are these
    vectors). A vector's ints depend on that vector alone, so they may be
    computed once and gathered wherever it is used. A float32 (or bfloat16)
    element within a factor 2^(column_bits - 24) of its vector's max is held
    exactly; a smaller one to within 2^-(column_bits + 1) of that max.
    """
    return _round_slices(x, -1, column_bits)


def _round_slices(x: torch.Tensor, dim: int, bits: int, amax: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    ints = _fresh64(x)
    unscale = _scale_(ints, dim, bits, amax)
    return ints.round_(), unscale  # round half to even, |ints| <= 2^bits


def split_rows(a: torch.Tensor, row_bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``a`` [..., M, K] as the left operand of ``sliced_product``: (stacked slices [..., 3M, K], unscale [..., M, 1])."""
    return _split_rows(a, row_bits)


def sliced_product(a_stacked: torch.Tensor, a_unscale: torch.Tensor, b_ints: torch.Tensor,
                   row_bits: int) -> torch.Tensor:
    """``a @ b_ints`` in float64 with an exact accumulation, from a's ``split_rows``.

    b_ints [..., K, N]: integers below 2^β_b (``split_last``'s, transposed);
    its unscale is the caller's to apply. One float64 GEMM sums integer
    products below 2^53, so its order (layout, batch folding, BLAS kernel,
    threads) cannot show in the bits; the three slices are then combined
    elementwise in one fixed order, a1 b + (a2 b + a3 b 2^-β) 2^-β. Each output
    element is a function of its row of ``a`` and its column of b alone.
    """
    return combine_parts(torch.matmul(a_stacked, b_ints), a_unscale, row_bits)


def combine_parts(parts: torch.Tensor, a_unscale: torch.Tensor, row_bits: int) -> torch.Tensor:
    """The three slices' exact products ``parts`` [..., 3M, N] combined in one fixed order, times a's unscale.

    a1 b + (a2 b + a3 b 2^-β) 2^-β: the only roundings of ``sliced_product``.
    ``parts`` may be a sum of several ranks' exact partial products (integers
    below 2^53 whichever subset is summed), so it may be all-reduced first.
    """
    num_rows = parts.shape[-2] // 3
    first, second, third = parts[..., :num_rows, :], parts[..., num_rows:2 * num_rows, :], parts[..., 2 * num_rows:, :]
    return third.mul_(2.0**-row_bits).add_(second).mul_(2.0**-row_bits).add_(first).mul_(a_unscale)


def product(a: torch.Tensor, b_ints: torch.Tensor, row_bits: int) -> torch.Tensor:
    """``sliced_product`` of ``a`` [..., M, K], sliced per row here."""
    return sliced_product(*_split_rows(a, row_bits), b_ints, row_bits)


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` with an exact float64 accumulation, returned in ``a.dtype``.

    a: [..., M, K], sliced per row; b: [..., K, N], per column; batch dims
    broadcast as in ``torch.matmul``. Each output element is a function of its
    row of ``a`` and its column of ``b`` alone.
    """
    row_bits, column_bits = slice_bits(a.shape[-1])
    b_ints, b_unscale = _round_slices(b, -2, column_bits)  # b_unscale: [..., 1, N]
    return product(a, b_ints, row_bits).mul_(b_unscale).to(a.dtype)


class WeightSlices:
    """A cache of each weight's integer slice for ``linear``: computed once per weight tensor, not per call.

    Entries are keyed by the tensor object (held weakly: a freed weight drops
    its entry) and checked against ``(data_ptr, _version, shape)``, so an
    in-place update (``copy_``, ``update_weights``) recomputes them. The
    float64 slice takes twice the weight's float32 memory. Inference-mode
    tensors track no version, so they are sliced at every call instead of
    trusting a stale entry.
    """

    def __init__(self) -> None:
        self._entries: WeakIdKeyDictionary = WeakIdKeyDictionary()

    def get(self, weight: torch.Tensor, *, shard: RowShard | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(ints [K, N], unscale [1, N]) of ``weight`` [N, K], sliced per output feature.

        ``shard``: ``weight`` is one rank's columns of a longer weight (a
        row-parallel linear); it is sliced with the full weight's bits and
        per-feature scales, so its ints are exactly the full weight's columns.
        """
        if weight.is_inference():
            return self._slice(weight, shard)
        key = (weight.data_ptr(), weight._version, tuple(weight.shape),
               None if shard is None else (shard.full_k, shard.amax.data_ptr(), shard.amax._version))
        entry = self._entries.get(weight)
        if entry is None or entry[0] != key:
            entry = (key, self._slice(weight, shard))
            self._entries[weight] = entry
        return entry[1]

    def __len__(self) -> int:
        return len(self._entries)

    def __reduce__(self):
        # entries are keyed by this process's tensors: a copy (or another process) starts empty
        return (WeightSlices, ())

    @staticmethod
    def _slice(weight: torch.Tensor, shard: RowShard | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if shard is None:
            _, column_bits = slice_bits(weight.shape[-1])
            ints, unscale = split_last(weight.detach(), column_bits)  # [N, K], [N, 1]
        else:
            _, column_bits = slice_bits(shard.full_k)
            ints, unscale = _round_slices(weight.detach(), -1, column_bits, shard.amax)
        return ints.t(), unscale.t()


@dataclass(frozen=True)
class RowShard:
    """What one rank's columns ``[N, K / ranks]`` of a row-parallel weight ``[N, K]`` need to slice as the whole.

    ``amax``: [N, 1] float64, each output feature's max-abs over all K (an
    all-reduce MAX of the ranks' own, once at load); ``full_k``: K.
    """

    full_k: int
    amax: torch.Tensor  # [N, 1] float64


SHARED_WEIGHT_SLICES = WeightSlices()  # the policies' default: a weight is sliced once however many policies use it


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
           slices: WeightSlices) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` with an exact float64 accumulation, returned in ``x.dtype``.

    x: [..., K], in three slices per row; weight: [N, K], one slice per output
    feature (cached in ``slices``); bias: [N] or None, added in float64 before
    the one rounding.
    """
    num_out, k = weight.shape
    w_ints, w_unscale = slices.get(weight)
    row_bits, _ = slice_bits(k)
    out = product(x.reshape(-1, k), w_ints, row_bits).mul_(w_unscale)
    if bias is not None:
        out.add_(bias)  # in float64, before the one rounding
    return out.to(x.dtype).view(*x.shape[:-1], num_out)


def sharded_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    shard: RowShard,
    slices: WeightSlices,
    all_reduce_max: Callable[[torch.Tensor], torch.Tensor],
    all_reduce_sum: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """``linear`` of a weight split over K across ranks, bit-identical to ``linear`` of the whole weight.

    x: [..., K / ranks], this rank's columns of the activations; weight: this
    rank's columns [N, K / ranks]. Every rank slices its part with the *whole*
    row's scale (``all_reduce_max`` of the rows' max-abs, [M, 1] float64) and
    the whole weight's (``shard``), so its slices are exactly the whole
    operands' columns; each rank's float64 GEMM then sums integer products
    exactly, and so does ``all_reduce_sum`` of the partial products (every
    subset of the K products sums below 2^53), in any rank order. The one
    rounding happens after the reduction, as in ``linear``: the bits do not
    depend on the number of ranks.
    """
    num_out, k = weight.shape
    row_bits, _ = slice_bits(shard.full_k)
    x2 = x.reshape(-1, k)
    x_amax = all_reduce_max(x2.abs().amax(-1, keepdim=True).to(torch.float64))  # [M, 1]
    w_ints, w_unscale = slices.get(weight, shard=shard)
    stacked, unscale = _split_rows(x2, row_bits, x_amax)
    parts = all_reduce_sum(torch.matmul(stacked, w_ints))  # [3M, N]: exact integer sums
    out = combine_parts(parts, unscale, row_bits).mul_(w_unscale)
    if bias is not None:
        out.add_(bias)
    return out.to(x.dtype).view(*x.shape[:-1], num_out)


def _row_sum_(x64: torch.Tensor) -> torch.Tensor:
    """``row_sum`` of a float64 tensor it may overwrite."""
    unscale = _scale_(x64, -1, _MANTISSA_BITS - _ceil_log2(x64.shape[-1]))
    # integers whose every partial sum is exact (bits below 2^-(53 - ceil log2 L) of the row max dropped)
    return x64.trunc_().sum(-1, keepdim=True).mul_(unscale).squeeze(-1)


def row_sum(x: torch.Tensor) -> torch.Tensor:
    """The sum over the last dim, [...] in float64, with one value whatever order it is added in."""
    return _row_sum_(_fresh64(x))


def row_cumsum(x: torch.Tensor) -> torch.Tensor:
    """The cumulative sum over the last dim, [..., L] in float64; every prefix is an exact sum."""
    ints = _fresh64(x)
    unscale = _scale_(ints, -1, _MANTISSA_BITS - _ceil_log2(x.shape[-1]))
    return torch.cumsum(ints.trunc_(), dim=-1).mul_(unscale)


def _horner(x: torch.Tensor, coeffs: tuple[float, ...]) -> torch.Tensor:
    # highest degree first; a separate multiply and add per step (nothing to contract into an FMA)
    acc = x * coeffs[0]
    for c in coeffs[1:-1]:
        acc.add_(c).mul_(x)
    return acc.add_(coeffs[-1])


_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01  # fdlibm's split of ln 2: n * _LN2_HI is exact for |n| < 2^11
_LN2_LO = 1.90821492927058770002e-10
_EXP_COEFFS = tuple(1.0 / math.factorial(k) for k in range(9, -1, -1))  # |r| <= ln2/2: error < 1e-11
_EXP_MIN, _EXP_MAX = -746.0, 710.0  # beyond these exp rounds to 0 / overflows to inf in float64
# 2 atanh(s) / s = 2 (1 + z/3 + z^2/5 + ...), z = s^2 <= 0.0295 (|s| <= 3 - 2 sqrt 2): error < 2e-13
_LOG_COEFFS = tuple(2.0 / (2 * k + 1) for k in range(7, -1, -1))
_SQRT_HALF = 0.7071067811865476


def exp64(x64: torch.Tensor) -> torch.Tensor:
    """exp of a float64 tensor from + - * and bit operations only (-inf -> 0, inf -> inf, nan -> nan)."""
    x = x64.clamp(_EXP_MIN, _EXP_MAX)
    n = torch.mul(x, _LOG2E).round_()
    r = x.sub_(n * _LN2_HI).sub_(n * _LN2_LO)  # x - n ln 2 in [-0.35, 0.35], about 1e-16 absolute error
    y = _horner(r, _EXP_COEFFS)
    n = n.to(torch.int64)
    half = n >> 1  # 2^n as two normal powers of two (n in [-1076, 1024]): one rounding, into subnormals or inf
    y.mul_(((n.sub_(half) + 1023) << 52).view(torch.float64))
    return y.mul_(((half + 1023) << 52).view(torch.float64))


def _log64_of_positive(x64: torch.Tensor) -> torch.Tensor:
    # log of finite x > 0 (sums of exps, uniform draws): log64 without its special cases
    mantissa, exponent = torch.frexp(x64)  # x = mantissa * 2^exponent, mantissa in [0.5, 1)
    is_small = mantissa < _SQRT_HALF
    mantissa = torch.where(is_small, mantissa * 2.0, mantissa)  # now in [sqrt(1/2), sqrt(2))
    e = (exponent - is_small.to(exponent.dtype)).double()
    f = mantissa.sub_(1.0)  # exact (Sterbenz)
    s = f / (f + 2.0)  # log(1 + f) = 2 atanh(s)
    y = _horner(s * s, _LOG_COEFFS).mul_(s)
    return (e * _LN2_LO).add_(y).add_(e.mul_(_LN2_HI))


def log64(x64: torch.Tensor) -> torch.Tensor:
    """Natural log of a float64 tensor from frexp, + - * / only (0 -> -inf, < 0 -> nan, inf -> inf)."""
    y = torch.where(x64 == 0, -math.inf, _log64_of_positive(x64))
    y = torch.where(x64 < 0, math.nan, y)
    return torch.where(x64 == math.inf, math.inf, y)


def gumbel(u64: torch.Tensor) -> torch.Tensor:
    """-log(-log(u)) in float32 for float64 u in (0, 1): Gumbel noise from uniform draws."""
    return _log64_of_positive(_log64_of_positive(u64).neg_()).neg_().float()


def exp(x: torch.Tensor) -> torch.Tensor:
    """``torch.exp(x)`` in x's dtype, computed in float64 from exact primitives (see ``exp64``)."""
    return exp64(x.double()).to(x.dtype)


def log(x: torch.Tensor) -> torch.Tensor:
    """``torch.log(x)`` in x's dtype, computed in float64 from exact primitives (see ``log64``)."""
    return log64(x.double()).to(x.dtype)


def silu(x: torch.Tensor) -> torch.Tensor:
    """``F.silu(x)`` = x / (1 + e^-x) in x's dtype, rounded once from float64."""
    x64 = _fresh64(x)
    return x64.div_(exp64(-x64).add_(1.0)).to(x.dtype)


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up for ``gate_up`` [..., 2I] = [gate; up], as ``TorchRowOps.swiglu`` computes it."""
    gate, up = gate_up.chunk(2, dim=-1)
    return silu(gate) * up


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``llm42.ops.norm.rms_norm`` with an exact sum of squares and 1/sqrt in float64; x: [..., H]."""
    dtype = x.dtype
    h = x.float()
    squares = _fresh64(h)
    squares.mul_(squares)  # squares of float32 values are exact in float64
    mean_square = _row_sum_(squares).div_(x.shape[-1])
    inv_rms = torch.reciprocal(mean_square.add_(eps).sqrt_()).float()
    return weight * (h * inv_rms[..., None]).to(dtype)


def _shifted(x: torch.Tensor) -> torch.Tensor:
    # x - rowmax in float64: exact for float32 x unless the two lie 2^29 apart (then rounded far below an ulp)
    x64 = _fresh64(x)
    return x64.sub_(x64.amax(-1, keepdim=True))


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim in float64 (exact denominators); a row of -inf gives nan, as torch does."""
    p = exp64(_shifted(x))
    return p.div_(row_sum(p)[..., None])


def log_softmax(x: torch.Tensor) -> torch.Tensor:
    """Log-softmax over the last dim in x's dtype, rounded once from float64 (exact denominators)."""
    shifted = _shifted(x)
    return shifted.sub_(_log64_of_positive(_row_sum_(exp64(shifted)))[..., None]).to(x.dtype)
