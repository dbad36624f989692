"""The shapes a canonical pass runs at: its row buckets, its result rows, its layer slices, and its GEMMs on
blocks of exactly R rows (``GemmRowBlocks``). Each is a function of the canonical config and the model only
(invariant 2); ``CanonicalPass`` captures one graph per (bucket, result rows) and, sliced, per slice."""

from __future__ import annotations

import torch

from llm42.policies.base import ReductionPolicy


class GemmRowBlocks:
    """A canonical policy whose GEMMs run on blocks of exactly ``rows`` rows (the wide pass's).

    ``linear`` (and ``row_parallel_linear``, where the policy has one) of n > ``rows`` rows is the
    policy's own on each contiguous block of ``rows`` rows, concatenated: the very call an R-row
    pass makes, so each row gets the bits it gets there. Everything else is the policy's.

    ``streams`` (CUDA streams, the pass's own): the blocks run side by side on them (block i on
    stream i mod len(streams); the caller's stream waits for them all), each block's call and operands
    exactly those of the serial loop, so the bits are the same; what changes is that one R-row
    GEMM of a small model fills a fraction of the SMs (SmolLM2's 256 x 960 x 576 qkv: ~30 tiles on
    132 SMs), and in a captured graph the blocks are independent branches the device runs at once.
    None or fewer than two run them one after another on the caller's stream. The streams must be
    the pass's alone (``llm42.cuda_graphs.lend_streams``): a graph captured on them bakes in each
    stream's cuBLAS workspace (round 2's hang came from two graphs run at once on one workspace).
    """

    def __init__(self, policy: ReductionPolicy, rows: int, *, streams: list[torch.cuda.Stream] | None = None):
        self._policy = policy
        self.rows = rows
        self.streams = list(streams or [])

    def __getattr__(self, name: str):
        if name == "_policy":  # not set yet (copy, unpickling): no recursion through __getattr__
            raise AttributeError(name)
        return getattr(self._policy, name)

    def _blocks(self, x: torch.Tensor, fn, *, parallel: bool = False) -> torch.Tensor:
        if x.shape[0] <= self.rows:
            return fn(x)
        starts = range(0, x.shape[0], self.rows)
        if not (parallel and x.is_cuda and len(self.streams) > 1):
            return torch.cat([fn(x[i: i + self.rows]) for i in starts])
        main = torch.cuda.current_stream(x.device)
        side = self.streams[:len(starts)]
        parts = []
        for s in side:  # every block's operands are ready on the caller's stream
            s.wait_stream(main)
        for b, i in enumerate(starts):
            with torch.cuda.stream(side[b % len(side)]):
                parts.append(fn(x[i: i + self.rows]))
        for s in side:
            main.wait_stream(s)
        for part in parts:  # made on a block's stream, read (by the cat) and freed on the caller's
            part.record_stream(main)
        return torch.cat(parts)

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return self._blocks(x, lambda part: self._policy.linear(part, weight, bias), parallel=True)

    def row_parallel_linear(self, x, weight, bias, *, tp, shard):
        """The policy's own on R-row blocks, else what ``forward`` does without one (on R-row blocks too);
        one block after another: each block's collective must be issued in the same order on every rank."""
        own = getattr(self._policy, "row_parallel_linear", None)
        if callable(own):
            return self._blocks(x, lambda part: own(part, weight, bias, tp=tp, shard=shard))
        out = tp.all_reduce_sum(self.linear(x, weight))
        return out if bias is None else out + bias

    def __repr__(self) -> str:
        streams = f", streams={len(self.streams)}" if len(self.streams) > 1 else ""
        return f"GemmRowBlocks({self._policy!r}, rows={self.rows}{streams})"


def pass_buckets(num_rows: int, max_rows: int, *, is_graphed: bool = True,
                 gemm_rows: int | None = None) -> tuple[int, ...]:
    """The row counts a pass runs at: with CUDA graphs R, 2R, 4R, ... below ``max_rows``, then ``max_rows``
    (a graph per bucket); without, every multiple of R up to ``max_rows`` (no row computed for nothing).

    ``gemm_rows`` (a policy whose GEMMs run on blocks of that many rows: ``FixedShapePolicy(gemm_rows=)``): each
    size of at least one block rounded up to whole blocks (within ``max_rows``), so that a wide pass's GEMMs pad
    no rows; a narrower size kept, its GEMMs padding their one block (a copy of the input per GEMM) while its row
    ops and attention run on its own rows. (Round 27 rounded the narrow sizes up too: on an H100, round 31, the
    passes then computed 2.16x the rows they used and dvr@50 served at 0.63 of nondet against the default's 0.76.)"""
    if not is_graphed:
        sizes = tuple(range(num_rows, max_rows + 1, num_rows))
    else:
        sizes, size = [], num_rows
        while size < max_rows:
            sizes.append(size)
            size *= 2
        sizes = tuple(sizes) + (max_rows,)
    if gemm_rows is None:
        return sizes
    return tuple(sorted({size if size < gemm_rows else min(max_rows, -(-size // gemm_rows) * gemm_rows)
                         for size in sizes}))


def confined_buckets(buckets: tuple[int, ...], max_rows: int | None) -> tuple[int, ...]:
    """The buckets of ``buckets`` whose passes a green context confines (``CanonicalPass(num_sms=,
    sms_max_rows=)``): those of at most ``max_rows`` rows (``None``: every one). A pass's bucket follows from its
    rows alone, so which SMs run it is a function of the pass, never of what runs beside it."""
    return tuple(b for b in buckets if max_rows is None or b <= max_rows)


def bucket_gemm_rows(policy: ReductionPolicy, device: torch.device, num_rows: int) -> int | None:
    """The GEMM block a pass's buckets are whole multiples of (``pass_buckets``): the policy's fixed GEMM M
    (``FixedShapePolicy(gemm_rows=)``) on CUDA, where its library GEMM runs on such blocks, if it is a multiple of
    R (the buckets stay multiples of R); else None (another M pads the GEMM blocks that need it: the same bits).
    On the CPU every canonical GEMM is the exact one, blocks or not: no row is computed for nothing."""
    rows = getattr(policy, "gemm_rows", None)
    if torch.device(device).type != "cuda" or not isinstance(rows, int) or isinstance(rows, bool):
        return None
    return rows if rows % num_rows == 0 else None


def result_sizes(num_rows: int, bucket: int, *, is_graphed: bool = True,
                 is_row_invariant: bool = False) -> tuple[int, ...]:
    """The result rows a pass of ``bucket`` rows may compute (head and sampler, on blocks of R = ``num_rows``):
    all R of an R-row pass; of a wider one R, 2R, 4R, ... up to the bucket with CUDA graphs (a graph each),
    every multiple of R without. ``is_row_invariant`` (the policy's head rows are their own at any number of
    rows: ``is_gemm_row_invariant``): also 8, 64, 512, ... rows below R, so that a pass of prompt chunks, which
    wants one result per chunk, runs the output head on a few rows rather than R."""
    if bucket == num_rows:
        sizes = (num_rows,)
    elif not is_graphed:
        sizes = tuple(num_rows * b for b in range(1, bucket // num_rows + 1))
    else:
        sizes, b = [], 1
        while b < bucket // num_rows:
            sizes.append(num_rows * b)
            b *= 2
        sizes = tuple(sizes) + (bucket,)
    small, n = [], SMALLEST_RESULTS
    while is_row_invariant and n < num_rows:
        small.append(n)
        n *= 8
    return tuple(small) + sizes


# the fewest result rows a pass computes where its head rows are its own at any number of rows (result_sizes)
SMALLEST_RESULTS = 8


def slice_bounds(num_layers: int, num_slices: int) -> tuple[int, ...]:
    """The first layer of each of ``num_slices`` slices of ``num_layers`` layers, then ``num_layers``: as even as
    whole layers allow (a slice takes ``num_layers // num_slices`` layers or one more, the larger ones first)."""
    size, extra = divmod(num_layers, num_slices)
    bounds = [0]
    for i in range(num_slices):
        bounds.append(bounds[-1] + size + (i < extra))
    return tuple(bounds)
