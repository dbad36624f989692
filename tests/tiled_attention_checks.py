"""Checks of the tiled attention kernels, shared by the CPU suite (Triton's interpreter, small shapes) and
the GPU suite (CUDA, model shapes): accuracy against float64, and the canonical kernel's row independence.

A *launch* is a list of rows ``(sequence, position, query)``. It is laid out either "varlen" (one
block-table row per sequence, ``row_seq`` = the sequence) or "static" (each row its own copy of its
sequence's table, ``row_seq`` = the sequence's first row in the launch: ``StepInputs.table_rows``).
"""

from __future__ import annotations

import random

import torch

from llm42.kernels import tiled_canonical_attention, tiled_prefill_attention
from tests.gpu.test_kernels import TOLERANCE, random_paged_cache, reference_attention, relative_error


class Cache:
    """A random paged K/V cache of ``num_seqs`` sequences, and random queries per (sequence, position)."""

    def __init__(self, *, num_seqs, max_context, num_heads, num_kv_heads, head_dim, block_size, dtype, device,
                 seed):
        self.generator = torch.Generator().manual_seed(seed)
        self.k, self.v, self.tables = random_paged_cache(
            num_seqs=num_seqs, max_context=max_context, num_kv_heads=num_kv_heads, head_dim=head_dim,
            block_size=block_size, dtype=dtype, device=device, generator=self.generator)
        self.num_seqs, self.max_context, self.block_size = num_seqs, max_context, block_size
        self.num_heads, self.head_dim, self.dtype, self.device = num_heads, head_dim, dtype, device
        self.scale = head_dim ** -0.5
        self._queries: dict[tuple[int, int], torch.Tensor] = {}

    def query(self, seq: int, pos: int) -> torch.Tensor:
        """The same query for (seq, pos) every time it is asked for: a row is identified by it."""
        if (seq, pos) not in self._queries:
            self._queries[(seq, pos)] = torch.randn(self.num_heads, self.head_dim, generator=self.generator)
        return self._queries[(seq, pos)]

    def layout(self, rows: list[tuple[int, int]], *, static: bool):
        """(q, positions, row_seq, tables) of a launch of ``rows`` = [(seq, pos)]."""
        q = torch.stack([self.query(s, p) for s, p in rows]).to(device=self.device, dtype=self.dtype)
        positions = torch.tensor([p for _, p in rows], dtype=torch.int64)
        seqs = torch.tensor([s for s, _ in rows], dtype=torch.int64)
        if static:
            first = {}
            row_seq = torch.tensor([first.setdefault(s, i) for i, (s, _) in enumerate(rows)], dtype=torch.int64)
            tables = self.tables[seqs.to(self.tables.device)]
        else:
            row_seq, tables = seqs, self.tables
        return q, positions.to(self.device), row_seq.to(self.device), tables

    def run(self, kernel, rows, *, static=False, **kwargs) -> torch.Tensor:
        q, positions, row_seq, tables = self.layout(rows, static=static)
        return kernel(q, self.k, self.v, positions, row_seq, tables, block_size=self.block_size, scale=self.scale,
                      **kwargs)

    def reference(self, rows, *, sliding_window=None) -> torch.Tensor:
        q, positions, _, _ = self.layout(rows, static=False)
        seqs = torch.tensor([s for s, _ in rows])
        return reference_attention(q, self.k, self.v, self.tables, seqs, positions.cpu(),
                                   block_size=self.block_size, scale=self.scale, sliding_window=sliding_window)


def mixed_rows(cache: Cache, rng: random.Random, *, num_chunks: int, num_decode: int,
               max_chunk: int | None = None) -> list[tuple[int, int]]:
    """Prompt chunks (runs of consecutive positions of one sequence) and lone decode rows, shuffled by run."""
    runs = []
    for _ in range(num_chunks):
        seq = rng.randrange(cache.num_seqs)
        length = rng.randint(1, max(1, min(cache.max_context // 3, max_chunk or cache.max_context)))
        start = rng.randrange(cache.max_context - length + 1)
        runs.append([(seq, p) for p in range(start, start + length)])
    runs += [[(rng.randrange(cache.num_seqs), rng.randrange(cache.max_context))] for _ in range(num_decode)]
    rng.shuffle(runs)
    return [row for run in runs for row in run]


def check_matches_float64(cache: Cache, kernel, rows, *, sliding_window=None, **kwargs) -> None:
    ref = cache.reference(rows, sliding_window=sliding_window)
    for static in (False, True):
        out = cache.run(kernel, rows, static=static, sliding_window=sliding_window, **kwargs)
        assert out.dtype == cache.dtype and out.shape == (len(rows), cache.num_heads, cache.head_dim)
        err = relative_error(out, ref)
        assert err < TOLERANCE[cache.dtype], (static, err)


def _bits(t: torch.Tensor) -> bytes:
    return t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()


def check_canonical_rows_are_their_own(cache: Cache, rng: random.Random, *, num_probes: int, num_launches: int,
                                       max_neighbours: int, key_block: int, sliding_window=None,
                                       mask_every_block=None, kernel=tiled_canonical_attention, tile_m=None) -> int:
    """Each probe row alone (one-row launch) and inside random launches: next to longer and shorter rows of
    its own sequence, other sequences' rows, at any index and tile, varlen or static: the same bits.
    Returns the number of (probe, launch) comparisons made. ``kernel``: a canonical launch (the tiled one, or
    the chunked one with its ``key_chunk`` bound); ``tile_m``: the canonical tile height (None: the default)."""
    kwargs = dict(key_block=key_block, sliding_window=sliding_window, mask_every_block=mask_every_block)
    if tile_m is not None:
        kwargs["tile_m"] = tile_m
    probes = [(rng.randrange(cache.num_seqs), rng.randrange(cache.max_context)) for _ in range(num_probes)]
    probes = list(dict.fromkeys(probes))
    alone = {p: _bits(cache.run(kernel, [p], **kwargs)[0]) for p in probes}
    compared = 0
    for _ in range(num_launches):
        rows = []
        for probe in probes:
            seq, pos = probe
            longer = [(seq, rng.randrange(pos, cache.max_context)) for _ in range(rng.randint(0, 3))]
            shorter = [(seq, rng.randrange(0, pos + 1)) for _ in range(rng.randint(0, 3))]
            run = sorted({*longer, *shorter} - {probe}, key=lambda r: r[1])
            run.insert(rng.randint(0, len(run)), probe)
            rows += run
            rows += [(rng.randrange(cache.num_seqs), rng.randrange(cache.max_context))
                     for _ in range(rng.randint(0, max_neighbours))]
        rows = [(rng.randrange(cache.num_seqs), rng.randrange(cache.max_context))
                for _ in range(rng.randint(0, max_neighbours))] + rows
        # a row appears once per launch (duplicates would be the same row anyway)
        rows = list(dict.fromkeys(rows))
        out = cache.run(kernel, rows, static=rng.random() < 0.5, **kwargs)
        for probe in probes:
            assert _bits(out[rows.index(probe)]) == alone[probe], (probe, rows)
            compared += 1
    return compared


def _toy_layer2_kv(out1: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    # a row-wise (elementwise) stand-in for the next layer's K/V projection: one head of each group
    return out1[:, ::groups] * 1.5, out1[:, groups - 1::groups] - 0.25


def check_kv_independent_of_chunking(cache: Cache, chunkings: list[list[int]], *, key_block: int,
                                     sliding_window=None, mask_every_block=None, tile_m=64) -> None:
    """Two toy layers over one prompt (sequence 0, positions [0, L)), canonical-prefilled in chunks: the
    second layer's K/V (written from the first layer's attention output) and its output are the same bits
    however the prompt is chunked (canonical tiles of ``tile_m`` M-rows)."""
    length = sum(chunkings[0])
    groups = cache.num_heads // cache.k.shape[1]
    results = []
    for chunks in chunkings:
        assert sum(chunks) == length
        k2, v2 = torch.zeros_like(cache.k), torch.zeros_like(cache.v)
        outs, start = [], 0
        for n in chunks:
            rows = [(0, p) for p in range(start, start + n)]
            out1 = cache.run(tiled_canonical_attention, rows, key_block=key_block, sliding_window=sliding_window,
                             mask_every_block=mask_every_block, tile_m=tile_m)
            pos = torch.arange(start, start + n)
            slots = (cache.tables[0].cpu()[pos // cache.block_size] * cache.block_size
                     + pos % cache.block_size).to(cache.device)
            k_rows, v_rows = _toy_layer2_kv(out1, groups)
            k2[slots], v2[slots] = k_rows, v_rows
            q, positions, row_seq, tables = cache.layout([(1, p) for p in range(start, start + n)], static=False)
            outs.append(tiled_canonical_attention(q, k2, v2, positions, torch.zeros_like(row_seq), cache.tables,
                                                  block_size=cache.block_size, scale=cache.scale,
                                                  key_block=key_block, sliding_window=sliding_window,
                                                  mask_every_block=mask_every_block, tile_m=tile_m))
            start += n
        pos = torch.arange(length)
        slots = (cache.tables[0].cpu()[pos // cache.block_size] * cache.block_size + pos % cache.block_size)
        results.append((_bits(k2[slots.to(cache.device)]), _bits(v2[slots.to(cache.device)]),
                        _bits(torch.cat(outs))))
    assert all(r == results[0] for r in results[1:])


def prefill_kernel(config):
    """``tiled_prefill_attention`` with a fixed ``config`` (block_m, block_n, warps, stages)."""
    def kernel(*args, **kwargs):
        return tiled_prefill_attention(*args, config=config, **kwargs)
    return kernel


def check_decode_launch_has_canonical_bits(cache: Cache, rng: random.Random, *, num_rows: int, key_block: int,
                                           sliding_window=None, tile_m=64) -> None:
    """``tiled_canonical_decode_attention`` (one row per tile, the fast path's option) on decode rows gives each
    row the bits the canonical launch gives it: packed with other sequences' decode rows, and as the last row of
    a verify window of its own sequence. ``num_rows`` decode rows, one per sequence of the cache."""
    from llm42.kernels import tiled_canonical_decode_attention

    seqs = list(range(min(num_rows, cache.num_seqs)))
    positions = [rng.randrange(cache.max_context) for _ in seqs]
    rows = list(zip(seqs, positions))
    q, _, _, _ = cache.layout(rows, static=False)
    context_lens = torch.tensor([p + 1 for p in positions], dtype=torch.int64, device=cache.device)
    tables = cache.tables[torch.tensor(seqs).to(cache.tables.device)]
    kwargs = dict(key_block=key_block, sliding_window=sliding_window, tile_m=tile_m)
    decode = tiled_canonical_decode_attention(q, cache.k, cache.v, tables, context_lens, block_size=cache.block_size,
                                              scale=cache.scale, **kwargs)
    packed = cache.run(tiled_canonical_attention, rows, **kwargs)
    assert _bits(decode) == _bits(packed)
    for i, (seq, pos) in enumerate(rows):
        window = [(seq, p) for p in range(max(0, pos - 7), pos + 1)]
        verify = cache.run(tiled_canonical_attention, window, static=True, **kwargs)
        assert _bits(decode[i]) == _bits(verify[-1]), (seq, pos)


def rows_with_full_blocks(rows: list[tuple[int, int]], *, key_block: int, sliding_window=None,
                          rows_per_tile: int) -> int:
    """Rows of a canonical launch that run at least one key block unmasked: rows whose group (the rows of
    one sequence in one tile, as the kernel forms it) has a key block that every one of its rows sees in
    full. What keeps the unmasked-block check from passing vacuously."""
    count = 0
    for start in range(0, len(rows), rows_per_tile):
        groups: dict[int, list[int]] = {}
        for seq, pos in rows[start:start + rows_per_tile]:
            groups.setdefault(seq, []).append(pos)
        for positions in groups.values():
            hi = [p + 1 for p in positions]
            lo = [0 if sliding_window is None else max(h - sliding_window, 0) for h in hi]
            full_lo = -(-max(lo) // key_block) * key_block
            full_hi = (min(hi) // key_block) * key_block
            count += len(positions) if full_hi > full_lo else 0
    return count


def check_unmasked_full_blocks_keep_the_bits(cache: Cache, rng: random.Random, *, num_launches: int,
                                             key_block: int, sliding_window=None, other=None) -> int:
    """The canonical launch with every key block masked and with the blocks every row of a tile's group sees
    in full unmasked: the same bits in every row, in random mixed launches (long prompt chunks, so that most
    blocks are full ones), varlen and static. ``other`` (kwargs for the second launch) replaces the unmasked
    variant: the negative control passes another canonical config there. Returns the rows compared that
    ran at least one key block unmasked (``rows_with_full_blocks``)."""
    from llm42.kernels.tiled_attention import CANONICAL_TILE_M

    compared = 0
    second = dict(mask_every_block=False) if other is None else other
    rows_per_tile = CANONICAL_TILE_M // (cache.num_heads // cache.k.shape[1])
    for _ in range(num_launches):
        rows = mixed_rows(cache, rng, num_chunks=3, num_decode=4)
        static = rng.random() < 0.5
        masked = cache.run(tiled_canonical_attention, rows, static=static, key_block=key_block,
                           sliding_window=sliding_window, mask_every_block=True)
        kwargs = {"key_block": key_block, "sliding_window": sliding_window, **second}
        unmasked = cache.run(tiled_canonical_attention, rows, static=static, **kwargs)
        for i in range(len(rows)):
            assert _bits(masked[i]) == _bits(unmasked[i]), (rows[i], second)
        compared += rows_with_full_blocks(rows, key_block=key_block, sliding_window=sliding_window,
                                          rows_per_tile=rows_per_tile)
    return compared


def check_deterministic_rows_take_canonical_bits(cache: Cache, rng: random.Random, *, key_block: int,
                                                 num_splits: int, sliding_window=None) -> int:
    """``FastPolicy(decode_kernel="deterministic")``'s pair of launches on one decode batch: the split-KV kernel
    skipping the flagged rows, then the one-row-per-tile canonical launch computing only those, into one output.
    A flagged row gets exactly the canonical decode launch's bits, an unflagged one exactly the split kernel's
    (at ``num_splits``), and each launch leaves the other's rows as they were (a sentinel survives there).
    One decode row per sequence of the cache; returns the number of flagged rows (both kinds are present)."""
    from llm42.kernels import paged_decode_attention, tiled_canonical_decode_attention

    seqs = list(range(cache.num_seqs))
    positions = [rng.randrange(cache.max_context) for _ in seqs]
    flags = [i % 2 for i in seqs]
    rng.shuffle(flags)
    flags[0], flags[-1] = 0, 1  # both kinds, whatever the shuffle did
    q, _, _, _ = cache.layout(list(zip(seqs, positions)), static=False)
    lens = torch.tensor([p + 1 for p in positions], dtype=torch.int64, device=cache.device)
    tables = cache.tables[torch.tensor(seqs).to(cache.tables.device)]
    det = torch.tensor(flags, dtype=torch.int8, device=cache.device)
    common = dict(block_size=cache.block_size, scale=cache.scale, sliding_window=sliding_window)
    split_all = paged_decode_attention(q, cache.k, cache.v, tables, lens, num_splits=num_splits, **common)
    canonical_all = tiled_canonical_decode_attention(q, cache.k, cache.v, tables, lens, key_block=key_block, **common)
    sentinel = torch.full_like(q, 7.0)
    out = paged_decode_attention(q, cache.k, cache.v, tables, lens, num_splits=num_splits, skip_rows=det,
                                 out=sentinel.clone(), **common)
    is_det = det.bool()
    assert _bits(out[is_det]) == _bits(sentinel[is_det]), "the split kernel wrote a row it was told to skip"
    assert _bits(out[~is_det]) == _bits(split_all[~is_det])
    only = tiled_canonical_decode_attention(q, cache.k, cache.v, tables, lens, key_block=key_block, only_rows=det,
                                            out=sentinel.clone(), **common)
    assert _bits(only[~is_det]) == _bits(sentinel[~is_det]), "the canonical launch wrote a row it was not given"
    combined = tiled_canonical_decode_attention(q, cache.k, cache.v, tables, lens, key_block=key_block,
                                                only_rows=det, out=out, **common)
    assert _bits(combined[is_det]) == _bits(canonical_all[is_det])
    assert _bits(combined[~is_det]) == _bits(split_all[~is_det])
    return int(is_det.sum())


def check_chunked_decode_has_canonical_bits(cache: Cache, rng: random.Random, *, key_block: int, key_chunk: int,
                                            sliding_window=None) -> int:
    """``chunked_canonical_decode_attention`` (one program per row, kv head and chunk, then the fold) gives each
    decode row the bits the chunked canonical launch gives it: packed with other sequences' rows, as the last
    row of a verify window, and with only some rows selected (the others' rows of ``out`` untouched). One decode
    row per sequence of the cache; returns the number of rows whose context spans more than one chunk."""
    import functools

    from llm42.kernels import chunked_canonical_attention, chunked_canonical_decode_attention

    canonical = functools.partial(chunked_canonical_attention, key_chunk=key_chunk)
    seqs = list(range(cache.num_seqs))
    positions = [rng.randrange(cache.max_context) for _ in seqs]
    rows = list(zip(seqs, positions))
    q, _, _, _ = cache.layout(rows, static=False)
    lens = torch.tensor([p + 1 for p in positions], dtype=torch.int64, device=cache.device)
    tables = cache.tables[torch.tensor(seqs).to(cache.tables.device)]
    kwargs = dict(key_block=key_block, sliding_window=sliding_window)
    common = dict(block_size=cache.block_size, scale=cache.scale, max_context_len=cache.max_context,
                  key_chunk=key_chunk, **kwargs)
    decode = chunked_canonical_decode_attention(q, cache.k, cache.v, tables, lens, **common)
    packed = cache.run(canonical, rows, **kwargs)
    assert _bits(decode) == _bits(packed)
    for i, (seq, pos) in enumerate(rows):
        window = [(seq, p) for p in range(max(0, pos - 7), pos + 1)]
        verify = cache.run(canonical, window, static=True, **kwargs)
        assert _bits(decode[i]) == _bits(verify[-1]), (seq, pos)
    flags = torch.tensor([i % 2 for i in seqs], dtype=torch.int8, device=cache.device)
    sentinel = torch.full_like(q, 7.0)
    only = chunked_canonical_decode_attention(q, cache.k, cache.v, tables, lens, only_rows=flags,
                                              out=sentinel.clone(), **common)
    is_det = flags.bool()
    assert _bits(only[is_det]) == _bits(decode[is_det])
    assert _bits(only[~is_det]) == _bits(sentinel[~is_det]), "the chunked launch wrote a row it was not given"
    return sum(p // key_chunk > 0 for p in positions)


def window_rows(cache: Cache, rng: random.Random, *, num_windows: int, max_window: int) -> list[tuple[int, int]]:
    """Runs of consecutive positions, one sequence each (a canonical pass's verify windows and prompt
    chunks), one after the other; a sequence may come back later in the launch (another run)."""
    rows: list[tuple[int, int]] = []
    for _ in range(num_windows):
        seq = rng.randrange(cache.num_seqs)
        length = rng.randint(1, max_window)
        start = rng.randrange(cache.max_context - length + 1)
        run = [(seq, p) for p in range(start, start + length) if (seq, p) not in rows]
        rows += run
    return rows


def check_tile_table_keeps_the_bits(cache: Cache, rng: random.Random, *, num_launches: int, max_window: int,
                                    key_block: int, sliding_window=None, tile_m=64) -> int:
    """The canonical launch with a staged tile table (each run of one sequence's rows in tiles of its own,
    ``llm42.cuda_graphs.tile_starts``) gives every row the bits of the fixed tiling, in the static layout the
    canonical pass stages; and the table is not the fixed tiling (some fixed tile spans two runs, none of the
    table's does). Returns the number of launches whose fixed tiling spanned runs (the comparisons that matter)."""
    import numpy as np

    from llm42.cuda_graphs import tile_starts
    from llm42.kernels.tiled_attention import canonical_rows_per_tile

    per_tile = canonical_rows_per_tile(cache.num_heads // cache.k.shape[1], tile_m)
    kwargs = dict(key_block=key_block, sliding_window=sliding_window, tile_m=tile_m)
    spanning = 0
    for _ in range(num_launches):
        rows = window_rows(cache, rng, num_windows=rng.randint(2, 6), max_window=max_window)
        q, positions, row_seq, tables = cache.layout(rows, static=True)
        # runs: consecutive rows of one sequence (the static layout's row_seq is one value per sequence)
        run_id = np.cumsum([True] + [a[0] != b[0] for a, b in zip(rows, rows[1:])])
        size = -(-len(rows) // per_tile) + len(rows)
        table = tile_starts(run_id, per_tile, size)
        starts = [int(t) for t in table if t < len(rows)]
        assert starts == sorted(set(starts)) and starts[0] == 0
        for lo, hi in zip(starts, starts[1:] + [len(rows)]):
            assert hi - lo <= per_tile and len(set(run_id[lo:hi])) == 1, (lo, hi)
        fixed = range(0, len(rows), per_tile)
        spanning += any(len(set(run_id[t:t + per_tile])) > 1 for t in fixed)
        args = (q, cache.k, cache.v, positions, row_seq, tables)
        base = tiled_canonical_attention(*args, block_size=cache.block_size, scale=cache.scale, **kwargs)
        tiled = tiled_canonical_attention(*args, block_size=cache.block_size, scale=cache.scale,
                                          tiles=torch.from_numpy(table).to(cache.device), **kwargs)
        assert _bits(tiled) == _bits(base), rows
        # the launch follows the table: with only its first tile, every other row is left as it was
        first_only = np.full_like(table, table[1])  # tile 0 = rows [0, table[1]), every other tile empty
        first_only[0] = 0
        out = torch.full_like(q, float("nan"))
        tiled_canonical_attention(*args, block_size=cache.block_size, scale=cache.scale, out=out,
                                  tiles=torch.from_numpy(first_only).to(cache.device), **kwargs)
        hi = int(table[1])
        assert _bits(out[:hi]) == _bits(base[:hi]) and bool(out[hi:].isnan().all()), hi
    return spanning


def poison_unseen_slots(cache: Cache, limit: int) -> None:
    """NaN in every K/V slot that no row at a position below ``limit`` can see: each sequence's slots from
    ``limit`` on and the blocks no table holds (what an unwritten page may hold). A load that reads such a slot
    unmasked into a softmax sum turns the row into NaN."""
    k, v = cache.k.view(-1, cache.block_size, *cache.k.shape[1:]), cache.v.view(-1, cache.block_size,
                                                                            *cache.v.shape[1:])
    held = set(cache.tables.flatten().tolist())
    for block in range(k.shape[0]):
        if block not in held:
            k[block], v[block] = float("nan"), float("nan")
    for seq in range(cache.num_seqs):
        for pos in range(limit, cache.tables.shape[1] * cache.block_size):
            block = int(cache.tables[seq, pos // cache.block_size])
            k[block, pos % cache.block_size] = float("nan")
            v[block, pos % cache.block_size] = float("nan")


def check_kv_tma_keeps_the_bits(cache: Cache, rng: random.Random, *, num_launches: int, limit: int,
                                key_block: int, sliding_window=None, tile_m=64, prefill_config=None) -> int:
    """K/V read through TMA descriptors (``kv_tma=True``: one box per key block, a whole page's run) and
    gathered key by key (``kv_tma=False``): every row the same bits, canonical launch (and, with
    ``prefill_config``, the fast prefill launch at that config), random mixed launches of rows below ``limit``
    over a cache whose other slots are NaN (``poison_unseen_slots``), varlen and static. Returns the rows
    compared; each is also checked finite (the boxes' unseen keys are zeroed, not summed)."""
    poison_unseen_slots(cache, limit)
    compared = 0
    for _ in range(num_launches):
        rows = [(s, p) for s, p in mixed_rows(cache, rng, num_chunks=3, num_decode=4) if p < limit]
        static = rng.random() < 0.5
        kernels = [(tiled_canonical_attention, dict(key_block=key_block, tile_m=tile_m))]
        if prefill_config is not None:
            kernels.append((prefill_kernel(prefill_config), {}))
        for kernel, kwargs in kernels:
            outs = [cache.run(kernel, rows, static=static, sliding_window=sliding_window, kv_tma=kv_tma, **kwargs)
                    for kv_tma in (False, True)]
            assert bool(torch.isfinite(outs[1]).all())
            for i in range(len(rows)):
                assert _bits(outs[0][i]) == _bits(outs[1][i]), (kernel, rows[i])
            compared += len(rows)
    return compared


def check_launch_keeps_the_bits(cache: Cache, rng: random.Random, *, num_launches: int, key_block: int,
                                sliding_window=None, tile_m=64) -> tuple[int, int]:
    """The canonical launch as the canonical pass runs it (``CANONICAL_LAUNCH``'s warps and stages, page ids
    ahead, a tile table of runs of one sequence, one pass per tile) and round 19's launch of the same tile height
    and key block (4 warps, 2 stages, page ids per block, the fixed tiling and the group loop): every row the same
    bits, random mixed launches in the static layout. Returns (rows compared, rows where the fast launch, which
    contracts to FMAs, gave other bits than the canonical one: the negative control, 0 in the interpreter)."""
    from llm42.cuda_graphs import tile_starts
    from llm42.kernels import tiled_attention as ta

    groups = cache.num_heads // cache.k.shape[1]
    compared = differ = 0
    for _ in range(num_launches):
        rows = mixed_rows(cache, rng, num_chunks=3, num_decode=4)
        q, positions, row_seq, tables = cache.layout(rows, static=True)
        args = (q, cache.k, cache.v, positions, row_seq, tables)
        common = dict(block_size=cache.block_size, scale=cache.scale, sliding_window=sliding_window)
        tiles = torch.from_numpy(tile_starts(row_seq.cpu().numpy(), tile_m // groups, len(rows))).to(q.device)
        launch = tiled_canonical_attention(*args, key_block=key_block, tile_m=tile_m, tiles=tiles, **common)
        round19 = ta._launch(*args, block_m=tile_m, block_n=key_block, num_warps=4, num_stages=2, prefetch=False,
                             is_canonical=True, **common)
        fast = ta._launch(*args, block_m=tile_m, block_n=key_block, num_warps=4, num_stages=2, is_canonical=False,
                          **common)
        for i in range(len(rows)):
            assert _bits(launch[i]) == _bits(round19[i]), rows[i]
            differ += _bits(fast[i]) != _bits(launch[i])
        compared += len(rows)
    return compared, differ


def check_decode_order_keeps_the_bits(cache: Cache, rng: random.Random, *, num_splits: int,
                                      sliding_window: int | None) -> None:
    """The split decode kernel's program order (head-major or sequence-major grid, any dispatch order of the
    sequences, ``inputs.longest_first`` among them: ``StepInputs.decode_order``) changes no bit of any row; and the
    order is read: an order that names one sequence twice leaves the one it omits as it was (a sentinel survives)."""
    from llm42.inputs import longest_first
    from llm42.kernels import attention, paged_decode_attention

    seqs = list(range(cache.num_seqs))
    positions = [rng.randrange(cache.max_context) for _ in seqs]
    q, _, _, _ = cache.layout(list(zip(seqs, positions)), static=False)
    lens = torch.tensor([p + 1 for p in positions], dtype=torch.int64, device=cache.device)
    tables = cache.tables[torch.tensor(seqs).to(cache.tables.device)]
    common = dict(block_size=cache.block_size, scale=cache.scale, sliding_window=sliding_window,
                  num_splits=num_splits)
    by_length = longest_first(lens)
    assert by_length.tolist() == sorted(seqs, key=lambda s: (-positions[s], s))
    shuffled = seqs[:]
    rng.shuffle(shuffled)
    saved = attention.DECODE_HEAD_MAJOR
    try:
        attention.DECODE_HEAD_MAJOR = False
        reference = _bits(paged_decode_attention(q, cache.k, cache.v, tables, lens, **common))
        for head_major in (False, True):
            attention.DECODE_HEAD_MAJOR = head_major
            for order in (None, by_length, torch.tensor(shuffled, device=cache.device)):
                out = paged_decode_attention(q, cache.k, cache.v, tables, lens, order=order, **common)
                assert _bits(out) == reference, f"head_major={head_major}, order={order}"
        # one split, which writes the output itself (with more, the combine kernel reads every row's partials)
        one = dict(common, num_splits=1)
        sentinel = torch.full_like(q, 7.0)
        twice = torch.tensor([0] + seqs[:-1], device=cache.device)  # the last sequence never dispatched
        out = paged_decode_attention(q, cache.k, cache.v, tables, lens, order=twice, out=sentinel.clone(), **one)
        assert _bits(out[-1:]) == _bits(sentinel[-1:]), "the kernel did not read the order"
        assert _bits(out[:-1]) == _bits(paged_decode_attention(q, cache.k, cache.v, tables, lens, **one)[:-1])
    finally:
        attention.DECODE_HEAD_MAJOR = saved
