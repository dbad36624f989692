"""All of llm42's CUDA-graph code: capture, pinned staging, static row buffers, fast-path decode graphs.

- ``capture_graph`` warms a function up on a side stream, then captures it.
- ``PackedStaging`` is one pinned host buffer of named regions, copied asynchronously into their device
  mirrors in one copy.
- ``StaticRows`` holds the static per-row inputs of a captured pass (the canonical pass uses it).
- ``DecodeGraphs`` captures the fast path's whole decode step — gather from the device-resident
  decode state, forward, sample, scatter back — once per batch bucket, largest first into one
  shared pool; a step of n sequences replays the smallest bucket >= n with padding rows.
- ``PrefillGraphs`` captures the fast path's prompt chunks per row bucket, ``MixedGraphs`` a step
  with both decode rows and prompt chunks (``llm42.engine.mixed``) per pair of buckets.

Replaying a graph runs exactly the kernels, with exactly the shapes, of the eager pass it
recorded, so a replay gives the same bits as the eager call (tests check replay == eager).
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import weakref
from collections.abc import Callable, Iterator, Mapping

import numpy as np
import torch

from llm42.inputs import StepInputs


_WARMUP_STREAMS: dict[int, torch.cuda.Stream] = {}


def _warmup_stream() -> torch.cuda.Stream:
    """One side stream per device for every warm-up before a capture.

    cuBLAS keeps a workspace per (handle, stream) from the caching allocator for the life of the
    process, so a fresh stream per capture left workspaces behind at every generator built: on
    the H200, device memory grew by 160 MiB per generator (tests/test_close.py).
    """
    device = torch.cuda.current_device()
    if device not in _WARMUP_STREAMS:
        _WARMUP_STREAMS[device] = torch.cuda.Stream(device)
    return _WARMUP_STREAMS[device]


_FREE_STREAMS: dict[tuple[int, int, int | None], list[torch.cuda.Stream]] = {}
# the green context behind each green stream (by the stream's id), alive as long as the process: its stream is pooled
_GREEN_CONTEXTS: dict[int, object] = {}


def green_contexts_supported() -> bool:
    """Whether this torch can confine a stream's kernels to a share of the SMs: CUDA green contexts with a stream
    of their own (``torch.cuda.green_contexts.GreenContext.Stream``; torch 2.11+ built with CUDA 12.8+)."""
    try:
        from torch.cuda import green_contexts
    except ImportError:
        return False
    return bool(getattr(green_contexts, "SUPPORTED", False)) and hasattr(green_contexts.GreenContext, "Stream")


def _green_stream(index: int, num_sms: int) -> torch.cuda.Stream:
    """A stream of a new green context holding ``num_sms`` SMs of device ``index`` (the driver rounds the count
    up to its SM group size: 8 on the H200). Every kernel launched on it, or replayed from a graph captured on it,
    runs on those SMs only; the rest of the device stays the other streams' (which may also use these)."""
    if not green_contexts_supported():
        raise RuntimeError("confining the canonical pass to a share of the SMs needs CUDA green contexts with a "
                           "stream of their own (torch.cuda.green_contexts.GreenContext.Stream: torch >= 2.11 "
                           f"built with CUDA >= 12.8); this torch {torch.__version__} has none")
    from torch.cuda.green_contexts import GreenContext

    context = GreenContext.create(num_sms=num_sms, device_id=index)
    stream = context.Stream()
    _GREEN_CONTEXTS[id(stream)] = context
    return stream


def lend_streams(owner: object, device: torch.device, count: int, *, priority: int = 0,
                 num_sms: int | None = None) -> list[torch.cuda.Stream]:
    """``count`` side streams of ``device`` that are ``owner``'s alone while it lives, then go back to a pool.

    A graph captured on a stream keeps that stream's cuBLAS workspace, so two objects whose graphs
    may replay at the same time must not share one; and a fresh stream per object would leave a
    workspace behind each time (see ``_warmup_stream``). Lent streams are both: exclusive while
    ``owner`` lives, reused by the next owner after it. On the H200 (round 15) a generator's own canonical
    stream, made fresh per generator, grew device memory by one 32 MiB workspace per generator built
    (tests/test_close.py). ``priority``: CUDA's stream priority (lower is higher), pooled apart.
    ``num_sms``: streams of green contexts of that many SMs (``_green_stream``; pooled apart, each its own
    context), whose kernels never take more of the device than that; ``priority`` does not apply to them.
    """
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (index, priority if num_sms is None else 0, num_sms)
    free = _FREE_STREAMS.setdefault(key, [])

    def fresh() -> torch.cuda.Stream:
        return torch.cuda.Stream(index, priority=priority) if num_sms is None else _green_stream(index, num_sms)

    streams = [free.pop() if free else fresh() for _ in range(count)]
    weakref.finalize(owner, free.extend, list(streams))
    return streams


@contextlib.contextmanager
def collector_off() -> Iterator[None]:
    """Python's cyclic garbage collector off while the block runs (as it was after).

    A collection that trips during a capture frees whatever cyclic garbage holds then, CUDA graphs and events of
    an earlier generator included, and destroying a graph while a stream captures is one of the calls a capture
    forbids: the capture is invalidated and the next kernel of it fails (round 40, an H100:
    ``CUBLAS_STATUS_EXECUTION_FAILED`` in a canonical pass's capture, then ``CUDAGraph::reset`` warnings "operation
    not permitted when stream is capturing"). torch 2.11 no longer collects before a capture
    (``force_cudagraph_gc``)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def capture_graph(fn: Callable[[], object], pool, *, stream: torch.cuda.Stream | None = None
                  ) -> tuple[torch.cuda.CUDAGraph, object]:
    """Warm ``fn`` up on a side stream (Triton compiles, cuBLAS initialises), then capture it.

    ``stream``: warm up and capture on this stream instead of the shared ones. cuBLAS keys its
    workspace by stream and a captured GEMM keeps the capture stream's workspace address, so graphs
    captured on one stream share one workspace: two of them replayed at the same time on two streams
    overwrite each other's split-K partial sums. A graph that runs beside the others (the canonical
    pass on its own stream) is captured on a stream of its own.
    """
    warm = _warmup_stream() if stream is None else stream
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        fn()
    torch.cuda.current_stream().wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    with collector_off(), torch.cuda.graph(graph, pool=pool, stream=stream):  # no collection inside the capture
        out = fn()
    return graph, out


def resolve_use_graph(use_graph: bool | None, device: torch.device) -> bool:
    if use_graph is None:
        return device.type == "cuda"
    if use_graph and device.type != "cuda":
        raise ValueError(f"CUDA graphs need a CUDA device, the model is on {device}")
    return use_graph


_NUMPY_DTYPES = {torch.int64: np.int64, torch.float32: np.float32}


class PackedStaging:
    """Named regions of one pinned host buffer, sent to their device mirrors in one asynchronous copy.

    ``regions``: (name, shape, dtype) each; every region is a fixed part of one device buffer (``device(name)``: a
    typed view that graphs may capture, its address fixed for the buffer's life) and of the pinned host buffer
    (``host(name)``: a NumPy view of the same layout, made once). ``wait`` blocks until the previous copy has left
    the host buffer, so a caller that never synchronises cannot overwrite data still in flight; ``copy(nbytes)``
    queues the copy of the first ``nbytes`` (default all) on the current stream and records its event.

    What it replaced (round 41): a ``Staging`` (pinned buffer, copy, event) per device buffer, six of them for one
    canonical pass (its rows, tiles, sequence tables, sampling rows twice, result rows): each its own wait, copy and
    event, and each staging its NumPy views anew (on an H100 host ~0.2 ms of a pass's 0.9 ms of staging was the
    copies alone, ``profile_passes.py --host-profile``)."""

    ALIGN = 64  # bytes: each region starts on a multiple (any dtype's view of it is aligned)

    def __init__(self, regions, device: torch.device):
        self._offsets: dict[str, tuple[int, int, tuple[int, ...], torch.dtype]] = {}
        self._itemsizes: dict[str, int] = {}
        offset = 0
        for name, shape, dtype in regions:
            self._itemsizes[name] = torch.empty((), dtype=dtype).element_size()
            nbytes = int(np.prod(shape, dtype=np.int64)) * self._itemsizes[name]
            self._offsets[name] = (offset, nbytes, tuple(shape), dtype)
            offset += -(-nbytes // self.ALIGN) * self.ALIGN
        self.nbytes = offset
        is_cuda = torch.device(device).type == "cuda"
        self._device = torch.zeros(offset, dtype=torch.uint8, device=device)
        self._host = torch.zeros(offset, dtype=torch.uint8, pin_memory=is_cuda)
        self._host_np = self._host.numpy()
        self._copied = torch.cuda.Event() if is_cuda else None
        self._is_pending = False
        self._device_views = {name: self._view(self._device, name) for name in self._offsets}
        self._host_views = {name: self._host_np[o: o + n].view(_NUMPY_DTYPES[dt]).reshape(shape)
                            for name, (o, n, shape, dt) in self._offsets.items()}

    def _view(self, buffer: torch.Tensor, name: str) -> torch.Tensor:
        offset, nbytes, shape, dtype = self._offsets[name]
        return buffer[offset: offset + nbytes].view(dtype).view(shape)

    def offset(self, name: str) -> int:
        """The byte offset of region ``name`` (a copy of the bytes before it and of its first part: ``copy``)."""
        return self._offsets[name][0]

    def device(self, name: str) -> torch.Tensor:
        return self._device_views[name]

    def host(self, name: str) -> np.ndarray:
        """The host view of region ``name``; write it only after ``wait``."""
        return self._host_views[name]

    def end_of(self, name: str, count: int) -> int:
        """The byte just past the first ``count`` elements of region ``name``: ``copy``'s size to send them."""
        return self._offsets[name][0] + count * self._itemsizes[name]

    def device_prefix(self, name: str, count: int) -> torch.Tensor:
        """The first ``count`` elements of region ``name`` on the device, flat."""
        offset, _, _, dtype = self._offsets[name]
        return self._device[offset: self.end_of(name, count)].view(dtype)

    def wait(self) -> None:
        if self._is_pending:
            self._copied.synchronize()
            self._is_pending = False

    def copy(self, nbytes: int | None = None) -> None:
        n = self.nbytes if nbytes is None else nbytes
        self._device[:n].copy_(self._host[:n], non_blocking=True)
        if self._copied is not None:
            self._copied.record()
            self._is_pending = True


class StaticRows:
    """Static per-row inputs of a captured pass: one int64 block, a block-table row per pass row (wide
    enough for a sequence of ``max_model_len`` positions) and one per staged sequence, which the host
    stages and the device copies to that sequence's rows. The canonical pass and the fast prefill
    graphs both read their ``StepInputs`` from here (``inputs``).

    Everything the host stages goes in one ``PackedStaging`` (``packed``) and one copy: the rows, the tile table,
    the sequences' tables (last, only as many bytes as staged) and the owner's own regions (``extra``: (name,
    shape, dtype) each, e.g. a pass's sampling rows). An owner that writes its regions after the rows stages them
    with ``send=False``, writes ``packed.host(name)`` and then calls ``send``."""

    # table_rows: each row's first row with the same block table (one value per sequence: StepInputs.table_rows);
    # segment: each row's index into the staged sequence tables (one per staged sequence, the last one the scratch
    # table)
    FIELDS = ("token_ids", "positions", "slot_mapping", "context_lens", "table_rows", "segment")

    def __init__(self, num_rows: int, max_model_len: int, kv, device: torch.device, *, max_seqs: int | None = None,
                 tile_rows: int | None = None, extra=()):
        """``max_seqs``: the most sequences one staging holds (default ``num_rows``): what the host stages.
        ``tile_rows``: also stage a tile table (``StepInputs.tiles``, ``tile_starts``) of tiles of at most that
        many rows, each within one sequence's rows (the canonical tiled attention's launch). ``extra``: the
        owner's regions in the same copy."""
        self.num_rows = num_rows
        self.max_seqs = num_rows if max_seqs is None else max_seqs
        self.tile_rows = tile_rows
        max_blocks = -(-max_model_len // kv.block_size)
        regions = [("ints", (len(self.FIELDS), num_rows), torch.int64)]
        if tile_rows is not None:  # at most one tile per row: the table never runs out
            regions.append(("tiles", (num_rows + 1,), torch.int64))
        regions += list(extra)
        # the host stages one table per sequence, packed (num_tables x width), the device gives each row its copy
        # (block_tables): a 2,048-row chunk of a 15K-token prompt copied 15 MB of per-row tables from the host per step
        regions.append(("tables", ((self.max_seqs + 1) * max_blocks,), torch.int64))
        self.packed = PackedStaging(regions, device)
        self.ints = self.packed.device("ints")
        self.tiles = self.packed.device("tiles") if tile_rows is not None else None
        self.block_tables = torch.full((num_rows, max_blocks), kv.scratch_block, dtype=torch.int64, device=device)
        self.row_seq = torch.arange(num_rows, device=device)
        self._scratch: tuple[object, np.ndarray] | None = None  # (store, each padding row's scratch slot)
        self._staged = (1, 1, num_rows)  # (tables, their width, rows) of the rows staged last, for ``send``
        self.stage(kv, [], [], [], [], [])  # dummy rows only: safe to run before any real pass

    def view(self, name: str, num_rows: int) -> torch.Tensor:
        return self.ints[self.FIELDS.index(name), :num_rows]

    def inputs(self, num_rows: int, *, max_context_len: int, logits_rows: torch.Tensor | None) -> StepInputs:
        """The ``StepInputs`` of the first ``num_rows`` staged rows: each row its own "sequence" with its
        own table row, ``table_rows`` saying which rows share one."""
        return StepInputs(
            token_ids=self.view("token_ids", num_rows),
            positions=self.view("positions", num_rows),
            slot_mapping=self.view("slot_mapping", num_rows),
            row_seq=self.row_seq[:num_rows],
            block_tables=self.block_tables[:num_rows],
            context_lens=self.view("context_lens", num_rows),
            seq_starts=tuple(range(num_rows + 1)),
            max_context_len=max_context_len,
            logits_rows=logits_rows,
            table_rows=self.view("table_rows", num_rows),
            tiles=None if self.tiles is None else self.tiles[: num_rows + 1],
        )

    def stage_segments(self, kv, segments, *, num_rows: int | None = None, send: bool = True) -> tuple[int, list[int]]:
        """Stage each segment's rows, each row with its sequence's block table, then padding rows.

        Returns (the largest position + 1, the index of each segment's last row). Every per-row field is
        computed in NumPy from per-segment values (a row's slot from its sequence's table, as attention reads
        it): a 2,048-row pass of 64 windows had cost ~0.5 ms of Python per-row lists on the host
        (``benchmarks/cpu_host_ab.py``). ``send=False``: the owner writes its own regions, then calls ``send``.
        """
        num_segments = len(segments)
        counts = np.fromiter((len(seg.tokens) for seg in segments), np.int64, num_segments)
        ends = np.cumsum(counts)
        firsts = ends - counts
        num_real = int(ends[-1]) if num_segments else 0
        tables = [kv.block_table(seg.rid) for seg in segments]
        table_of_row = np.repeat(np.arange(num_segments, dtype=np.int64), counts)
        starts = np.fromiter((seg.start for seg in segments), np.int64, num_segments)
        positions = np.arange(num_real, dtype=np.int64) + np.repeat(starts - firsts, counts)
        tokens = np.fromiter(itertools.chain.from_iterable(seg.tokens for seg in segments), np.int64, num_real)
        max_len = self._write(kv, tokens, positions, None, tables, table_of_row, np.repeat(firsts, counts),
                              num_rows=num_rows, send=send)
        return max_len, (ends - 1).tolist()

    def stage(self, kv, tokens: list[int], positions: list[int], slots: list[int],
              row_tables: list[list[int]], table_of_row: list[int], *, num_rows: int | None = None) -> int:
        """Write real rows then padding rows up to ``num_rows`` (default all); returns the largest position + 1.

        ``row_tables[table_of_row[i]]`` is row i's block table. Padding rows hold
        token 0 at position 0, read the scratch block and write distinct scratch slots.
        """
        rows = np.array(table_of_row, dtype=np.int64)
        _, first_row, which = np.unique(rows, return_index=True, return_inverse=True)
        return self._write(kv, np.array(tokens, dtype=np.int64), np.array(positions, dtype=np.int64),
                           np.array(slots, dtype=np.int64), row_tables, rows, first_row[which].astype(np.int64),
                           num_rows=num_rows, send=True)

    def _write(self, kv, tokens: np.ndarray, positions: np.ndarray, slots: np.ndarray | None,
               row_tables: list[list[int]], table_of_row: np.ndarray, first_rows: np.ndarray, *,
               num_rows: int | None, send: bool) -> int:
        """``stage``'s rows as arrays: ``slots`` None computes each row's from its table; ``first_rows``: each real
        row's first row with the same table."""
        num_rows = self.num_rows if num_rows is None else num_rows
        if len(row_tables) > self.max_seqs:
            raise ValueError(f"{len(row_tables)} sequences staged into static rows that hold at most {self.max_seqs}")
        n = tokens.size
        if n > num_rows:
            raise ValueError(f"{n} rows staged into {num_rows} static rows")
        packed = self.packed
        packed.wait()  # the copy before has left the host buffer
        scratch, num_tables = kv.scratch_block, len(row_tables) + 1  # the last table the scratch one (padding)
        width = max(max(map(len, row_tables), default=1), 1)
        # one array for every table, each padded with the scratch block (and the scratch table last): a
        # tensor per table cost 1.5 ms of a 2,048-row pass's 6 ms of staging on the host (64 sequences)
        lengths = np.fromiter(map(len, row_tables), np.int64, len(row_tables))
        tables = packed.host("tables")[: num_tables * width].reshape(num_tables, width)
        tables.fill(scratch)
        if lengths.size:
            flat = np.fromiter(itertools.chain.from_iterable(row_tables), np.int64, int(lengths.sum()))
            columns = np.arange(flat.size, dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
            tables[np.repeat(np.arange(lengths.size, dtype=np.int64), lengths), columns] = flat
        if slots is None:
            block_size = kv.block_size
            slots = tables[table_of_row, positions // block_size] * block_size + positions % block_size
        host = packed.host("ints")[:, :num_rows]
        host[0, :n], host[0, n:] = tokens, 0
        host[1, :n], host[1, n:] = positions, 0
        host[2, :n], host[2, n:] = slots, self._scratch_slots(kv, n, num_rows)
        host[3] = host[1] + 1
        host[4, :n], host[4, n:] = first_rows, n  # padding rows: the first padding row
        host[5, :n], host[5, n:] = table_of_row, len(row_tables)
        if self.tiles is not None:
            packed.host("tiles")[: num_rows + 1] = tile_starts(host[5], self.tile_rows, num_rows)
        self._staged = (num_tables, width, num_rows)
        if send:
            self.send()
        return (int(positions.max()) if n else 0) + 1

    def send(self) -> None:
        """Copy what was staged (the rows, the tiles, the owner's regions, the staged tables) in one copy, then give
        each row its sequence's table on the device. Rows past the staged ones keep stale values nobody reads."""
        num_tables, width, num_rows = self._staged
        packed = self.packed
        packed.copy(packed.end_of("tables", num_tables * width))
        tables = packed.device_prefix("tables", num_tables * width).view(num_tables, width)
        # each row's copy of its sequence's table, gathered on the device; columns past `width` keep stale
        # (valid) block ids: no row attends to a position past its own
        self.block_tables[:num_rows, :width] = tables.index_select(0, self.view("segment", num_rows))

    def _scratch_slots(self, kv, start: int, end: int) -> np.ndarray:
        """The scratch slots of padding rows ``start .. end`` (``kv.scratch_slot``, kept once per store)."""
        if self._scratch is None or self._scratch[0] is not kv:
            self._scratch = (kv, np.array([kv.scratch_slot(i) for i in range(self.num_rows)], dtype=np.int64))
        return self._scratch[1][start:end]


def tile_starts(groups: np.ndarray, rows_per_tile: int, size: int) -> np.ndarray:
    """A tile table of ``size`` + 1 entries for rows of ``groups`` (one id per row): tile t is the rows
    [out[t], out[t + 1]), at most ``rows_per_tile`` of them, all of one run of equal ids; entries past the
    last tile are the row count (empty tiles). ``size`` must hold the runs' tiles (``size`` >= the row count
    always does): ValueError otherwise (the canonical launch runs one pass per tile, so a tile may not span
    two runs)."""
    n = len(groups)
    out = np.full(size + 1, n, dtype=np.int64)
    if n == 0:
        return out
    starts = np.flatnonzero(np.concatenate(([True], groups[1:] != groups[:-1])))
    counts = -(-np.diff(np.append(starts, n)) // rows_per_tile)
    total = int(counts.sum())
    if total > size:
        raise ValueError(f"tile_starts: the runs need {total} tiles, the table holds {size} (size: at least the "
                         f"row count, {n})")
    first_tile = np.cumsum(counts) - counts  # each run's first tile
    within = np.arange(total, dtype=np.int64) - np.repeat(first_tile, counts)
    out[:total] = np.repeat(starts, counts) + within * rows_per_tile
    return out


def host_int64(values: list[int]) -> torch.Tensor:
    """A CPU int64 tensor of a Python list, through NumPy: a third of ``torch.tensor``'s time on a list of
    2,048 ints (the rows a pass or prompt chunk stages every step)."""
    return torch.from_numpy(np.array(values, dtype=np.int64))


def decode_buckets(max_batch_size: int) -> tuple[int, ...]:
    """Batch sizes with a captured decode graph: 1, 2, 4, 8, then every multiple of 16 up to the maximum."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_batch_size]
    sizes += list(range(16, max_batch_size, 16))
    return tuple(sizes) + (max_batch_size,)


def cheapest_buckets(times: Mapping[int, float], *, max_growth: float = 1.25,
                     min_gain: float = 0.03) -> dict[int, int]:
    """Each bucket of ``times`` (ms per replay of its graph) mapped to the fastest bucket at most ``max_growth``
    times its size, where that one replays more than ``min_gain`` faster; buckets left as they are are absent.

    Why (round 52, one H100): cuBLAS's time is not monotone in M. The 8B shape's decode GEMMs took 9.07 ms at 288
    rows against 8.22 at 304, and 14.98 at 448 against 11.94 at 512: the library picks another kernel per M. A
    decode batch may replay a larger bucket's graph (its extra rows are padding, which reads and writes only the
    scratch block); its own rows' fast-path values may then differ in rounding, as they may with any other batch,
    and committed bits never do."""
    sizes = sorted(times)
    remap = {}
    for i, bucket in enumerate(sizes):
        best = min((b for b in sizes[i:] if b <= bucket * max_growth), key=lambda b: (times[b], b))
        if best != bucket and times[best] < (1.0 - min_gain) * times[bucket]:
            remap[bucket] = best
    return remap


class DecodeGraphs:
    """Whole fast decode steps (``DecodeState.decode``) captured per batch bucket and sampling variant.

    Captured lazily: a bucket's greedy graph the first time a greedy step of that size runs, its
    sampling graph the first time a step with a sampled row does; or all up front
    (``DVRGenerator.capture_graphs``, which ``llm42 serve`` runs at start-up). All share one memory pool
    (buckets never run concurrently). The captured graphs read the decode state's persistent
    buffers, so they stay valid as requests come and go.
    """

    def __init__(self, state, *, max_batch_size: int):
        if state.device.type != "cuda":
            raise ValueError(f"decode CUDA graphs need a CUDA device, the model is on {state.device}")
        self.state = state
        self.buckets = decode_buckets(max_batch_size)
        self.bucket_map: dict[int, int] = {}  # a bucket -> the larger one whose graph it replays (set_bucket_map)
        self._graphs: dict[tuple[int, bool, bool], tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, torch.Tensor]]] = {}
        self._pool = torch.cuda.graph_pool_handle()

    @property
    def max_batch_size(self) -> int:
        return self.buckets[-1]

    @property
    def is_captured(self) -> bool:
        return bool(self._graphs)

    @property
    def num_captured(self) -> int:
        return len(self._graphs)

    def bucket_for(self, num_seqs: int) -> int:
        bucket = next(b for b in self.buckets if b >= num_seqs)
        return self.bucket_map.get(bucket, bucket)

    def set_bucket_map(self, bucket_map: Mapping[int, int]) -> None:
        """Replay each key bucket's batches on the value bucket's graph (``cheapest_buckets``); {} undoes it."""
        for bucket, target in bucket_map.items():
            if bucket not in self.buckets or target not in self.buckets or target < bucket:
                raise ValueError(f"a decode bucket map sends buckets to larger buckets of {self.buckets[0]}.."
                                 f"{self.buckets[-1]}, got {bucket} -> {target}")
        self.bucket_map = dict(bucket_map)

    def run(self, num_seqs: int, variant: tuple[bool, bool]) -> tuple[torch.Tensor, torch.Tensor]:
        """Replay the step for the ``num_seqs`` slots staged in ``state.batch``; returns static (tokens, log-probs).

        ``variant``: (any row sampled, any sampled row with top-k / top-p), as ``stage_batch`` returns it.
        """
        bucket = self.bucket_for(num_seqs)
        key = (bucket, *variant)
        if key not in self._graphs:
            state = self.state
            # the warm-up run executes the step: put the device state back so the replay below runs it once
            saved = state.snapshot()
            self._graphs[key] = capture_graph(
                lambda: state.decode(bucket, variant=variant, max_context_len=None), self._pool
            )
            state.restore(saved)
        graph, (tokens, logprobs) = self._graphs[key]
        graph.replay()
        return tokens[:num_seqs], logprobs[:num_seqs]


def row_buckets(max_rows: int, step: int | None = None, *, smallest: int = 16) -> tuple[int, ...]:
    """Row counts with a captured graph: powers of two from ``smallest`` below ``step``, then every multiple of
    ``step``, then ``max_rows``. ``step=None``: powers of two all the way (a step of ``max_rows`` or more does
    the same).

    The ladder is the padding a step pays: a step of n rows runs the smallest bucket >= n. On a compute-bound
    model every padding row costs a real row's GEMM FLOPs, so above ``step`` the ladder is linear (at most
    ``step - 1`` padding rows) rather than doubling (up to half the rows).
    """
    sizes, size = [], smallest
    while size < max_rows and (step is None or size < step):
        sizes.append(size)
        size *= 2
    if step is not None:
        size = max(step, smallest)
        while size < max_rows:
            sizes.append(size)
            size += step
    return tuple(sizes) + (max_rows,)


def prefill_buckets(max_rows: int, step: int | None = None) -> tuple[int, ...]:
    """Row counts with a captured prefill graph (``row_buckets``): powers of two from 16 up to ``step``, then
    its multiples, then the maximum."""
    return row_buckets(max_rows, step)


class PrefillGraphs:
    """The fast path's prompt chunks (``FastPrefill.forward_sample``) captured per row bucket and sampling variant.

    Like ``DecodeGraphs``: captured lazily into one pool, replayed on the staged static rows.
    """

    def __init__(self, prefill, *, bucket_step: int | None = None):
        # a weak reference: the prefill owns these graphs, and a cycle would keep its K/V store and
        # weights on the device until the garbage collector runs
        self.prefill = weakref.proxy(prefill)
        self.buckets = prefill_buckets(prefill.max_rows, bucket_step)
        self._graphs: dict[tuple[int, bool], tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, torch.Tensor]]] = {}
        self._pool = torch.cuda.graph_pool_handle()

    @property
    def num_captured(self) -> int:
        return len(self._graphs)

    def bucket_for(self, num_rows: int) -> int:
        return next(b for b in self.buckets if b >= num_rows)

    def run(self, bucket: int, variant: tuple[bool, bool]) -> tuple[torch.Tensor, torch.Tensor]:
        key = (bucket, *variant)
        if key not in self._graphs:
            prefill = self.prefill  # its warm-up run only rewrites K/V the replay writes again
            self._graphs[key] = capture_graph(
                lambda: prefill.forward_sample(bucket, variant=variant, max_context_len=None),
                self._pool,
            )
        graph, outputs = self._graphs[key]
        graph.replay()
        return outputs


class MixedGraphs:
    """A fast step's decode rows and prompt chunks in one pass (``MixedStep.forward_sample``), captured per
    (decode bucket, prompt-row bucket, sampling variant).

    Like ``DecodeGraphs``: captured lazily into one pool, the decode state put back after each warm-up run.
    """

    def __init__(self, mixed):
        self.mixed = weakref.proxy(mixed)  # the step owns these graphs (see PrefillGraphs)
        self._graphs: dict[tuple[int, int, bool, bool], tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...]]] = {}
        self._pool = torch.cuda.graph_pool_handle()

    @property
    def num_captured(self) -> int:
        return len(self._graphs)

    def run(self, decode_bucket: int, prompt_bucket: int, variant: tuple[bool, bool]) -> tuple[torch.Tensor, ...]:
        key = (decode_bucket, prompt_bucket, *variant)
        if key not in self._graphs:
            mixed = self.mixed
            state = mixed.decode_state
            saved = state.snapshot()  # the warm-up run executes the step: the replay below runs it once
            try:
                self._graphs[key] = capture_graph(
                    lambda: mixed.forward_sample(decode_bucket, prompt_bucket, variant=variant, max_context_len=None),
                    self._pool,
                )
            finally:  # a failed capture (out of memory) leaves the decode state as it found it: the caller may
                state.restore(saved)  # run the step another way (``FastStep``: two passes)
        graph, outputs = self._graphs[key]
        graph.replay()
        return outputs
