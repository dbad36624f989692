"""CUDA graphs: the canonical pass captured once, and fast decode steps captured per batch bucket.

All of llm42's graph capture lives in this module.

- ``CanonicalGraph`` holds static max-size input buffers for the canonical
  pass (token ids, positions, slot mapping, per-row block tables, sampling
  rows), captures ``forward`` once at R rows, and captures the sampler on its
  logits (a greedy-only variant and a sampling variant, chosen on the host, so
  nothing inside the graph synchronises). ``GraphVerifier`` is the Verifier
  running over it: same ``verify(work, kv)`` contract, same commit rule.
- ``DecodeGraphs`` captures the fast path's decode step for bucketed batch
  sizes, largest first into one shared memory pool; a step pads its batch up
  to the next bucket with explicit padding rows that write scratch slots.

Replaying a graph runs exactly the kernels, with exactly the shapes, of the
eager pass it recorded, so the canonical result does not change (tests check
replay == eager bit for bit). The captured graphs are bound to one K/V store's
tensors; a different store triggers a fresh capture.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import torch

from llm42.inputs import StepInputs
from llm42.kv_store import KVStoreProtocol
from llm42.model.forward import forward
from llm42.params import SamplingParams
from llm42.policies.base import ReductionPolicy
from llm42.runner import ModelRunner, Segment, StepOutput
from llm42.sampler import SamplingRows, sample
from llm42.verify.verifier import Verifier
from llm42.verify.windows import CanonicalConfig


def capture_graph(fn: Callable[[], object], pool) -> tuple[torch.cuda.CUDAGraph, object]:
    """Warm ``fn`` up on a side stream (Triton compiles, cuBLAS initialises), then capture it."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn()
    return graph, out


def _resolve_use_graph(use_graph: bool | None, device: torch.device) -> bool:
    if use_graph is None:
        return device.type == "cuda"
    if use_graph and device.type != "cuda":
        raise ValueError(f"CUDA graphs need a CUDA device, the model is on {device}")
    return use_graph


class _Staging:
    """A pinned host buffer, copied asynchronously into (part of) a device buffer.

    ``host()`` waits until the previous copy has left the buffer, so a caller
    that never synchronises cannot overwrite data still in flight.
    """

    def __init__(self, device_buffer: torch.Tensor):
        self.device_buffer = device_buffer
        is_cuda = device_buffer.is_cuda
        self._host = torch.zeros(device_buffer.shape, dtype=device_buffer.dtype, pin_memory=is_cuda)
        self._copied = torch.cuda.Event() if is_cuda else None
        self._is_pending = False

    def host(self) -> torch.Tensor:
        if self._is_pending:
            self._copied.synchronize()
            self._is_pending = False
        return self._host

    def copy(self, dst: torch.Tensor | None = None, src: torch.Tensor | None = None) -> None:
        """Copy ``src`` (a view of the host buffer; default all of it) into ``dst`` (default the device buffer)."""
        dst = self.device_buffer if dst is None else dst
        dst.copy_(self._host if src is None else src, non_blocking=True)
        if self._copied is not None:
            self._copied.record()
            self._is_pending = True


class _StaticRows:
    """Static per-row inputs of a captured pass: one int64 block and one block-table buffer."""

    FIELDS = ("token_ids", "positions", "slot_mapping", "context_lens")

    def __init__(self, num_rows: int, max_blocks: int, kv: KVStoreProtocol, device: torch.device):
        self.num_rows = num_rows
        self.ints = torch.zeros((len(self.FIELDS), num_rows), dtype=torch.int64, device=device)
        self.block_tables = torch.full((num_rows, max_blocks), kv.scratch_block, dtype=torch.int64, device=device)
        self.row_seq = torch.arange(num_rows, device=device)
        self._staging = _Staging(self.ints)
        self._table_staging = _Staging(self.block_tables)
        self.stage(kv, [], [], [], [], [])  # dummy rows only: safe to run before any real pass

    def view(self, name: str, num_rows: int) -> torch.Tensor:
        return self.ints[self.FIELDS.index(name), :num_rows]

    def stage(self, kv: KVStoreProtocol, tokens: list[int], positions: list[int], slots: list[int],
              row_tables: list[list[int]], table_of_row: list[int], *, num_rows: int | None = None) -> int:
        """Write real rows then padding rows up to ``num_rows``; returns the largest position + 1.

        ``row_tables[table_of_row[i]]`` is row i's block table. Padding rows hold
        token 0 at position 0, read the scratch block and write distinct scratch slots.
        """
        num_rows = self.num_rows if num_rows is None else num_rows
        num_real = len(tokens)
        pad = range(num_real, num_rows)
        positions = positions + [0] * len(pad)
        host = self._staging.host()[:, :num_rows]
        host[0] = torch.tensor(tokens + [0] * len(pad), dtype=torch.int64)
        host[1] = torch.tensor(positions, dtype=torch.int64)
        host[2] = torch.tensor(slots + [kv.scratch_slot(i) for i in pad], dtype=torch.int64)
        host[3] = host[1] + 1
        self._staging.copy()  # the whole (small) buffer: rows past num_rows are not read

        scratch = kv.scratch_block
        width = max([len(t) for t in row_tables] + [1])
        padded = [table + [scratch] * (width - len(table)) for table in row_tables] + [[scratch] * width]
        tables = np.array(padded, dtype=np.int64)  # [tables + 1, width], the last one the scratch table
        rows = np.array(table_of_row + [len(row_tables)] * len(pad), dtype=np.int64)
        host_tables = self._table_staging.host().view(-1)[: num_rows * width].view(num_rows, width)
        np.take(tables, rows, axis=0, out=host_tables.numpy())
        # columns past `width` keep stale entries: no row reads a block past its own position
        self._table_staging.copy(self.block_tables[:num_rows, :width], host_tables)
        return max(positions, default=0) + 1


class CanonicalGraph:
    """The canonical pass of exactly ``num_rows`` rows as a captured forward + sampler.

    It offers the three runner methods ``Verifier.verify`` uses
    (``canonical_inputs``, ``sampling_rows``, ``run``): the first two stage
    this pass into the static buffers, ``run`` replays. ``use_graph=False``
    runs the same static-buffer pass eagerly (and works on the CPU).
    """

    def __init__(self, runner: ModelRunner, policy: ReductionPolicy, num_rows: int, *,
                 use_graph: bool | None = None):
        self.runner = runner
        self.policy = policy
        self.num_rows = num_rows
        self.device = runner.device
        self.is_graphed = _resolve_use_graph(use_graph, self.device)
        self._kv: KVStoreProtocol | None = None
        self._inputs: StepInputs | None = None
        self._forward_graph: torch.cuda.CUDAGraph | None = None
        self._logits: torch.Tensor | None = None
        self._samplers: dict[bool, tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, torch.Tensor]]] = {}
        self._pool = None
        self._is_any_sampled = False

    # -- static buffers and capture ---------------------------------------------------------------
    def _bind(self, kv: KVStoreProtocol) -> None:
        """Allocate static buffers for ``kv`` and (on CUDA) capture the forward pass."""
        cfg = self.runner.cfg
        num_rows, device = self.num_rows, self.device
        max_blocks = -(-cfg.max_position_embeddings // kv.block_size)
        self._rows = _StaticRows(num_rows, max_blocks, kv, device)
        self._sampling_ints = torch.zeros((3, num_rows), dtype=torch.int64, device=device)  # top_k, seeds, pos
        self._sampling_floats = torch.zeros((2, num_rows), dtype=torch.float32, device=device)  # temp, top_p
        self._sampling_floats[1] = 1.0
        self._staging_ints = _Staging(self._sampling_ints)
        self._staging_floats = _Staging(self._sampling_floats)
        self._inputs = StepInputs(
            token_ids=self._rows.view("token_ids", num_rows),
            positions=self._rows.view("positions", num_rows),
            slot_mapping=self._rows.view("slot_mapping", num_rows),
            row_seq=self._rows.row_seq,
            block_tables=self._rows.block_tables,
            context_lens=self._rows.view("context_lens", num_rows),
            seq_starts=tuple(range(num_rows + 1)),
            max_context_len=cfg.max_position_embeddings,  # a bound; CUDA kernels never read it
            logits_rows=None,
        )
        self._kv = kv
        self._samplers.clear()
        self._forward_graph = None
        if self.is_graphed:
            self._pool = torch.cuda.graph_pool_handle()
            layers = kv.layers()
            self._forward_graph, self._logits = capture_graph(
                lambda: forward(self.runner.weights, cfg, self._inputs, layers, self.policy), self._pool
            )

    def _static_sampling_rows(self, is_any_sampled: bool) -> SamplingRows:
        return SamplingRows(
            temperature=self._sampling_floats[0], top_k=self._sampling_ints[0], top_p=self._sampling_floats[1],
            seeds=self._sampling_ints[1], positions=self._sampling_ints[2], is_any_sampled=is_any_sampled,
        )

    def _sampler(self, is_any_sampled: bool) -> tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, torch.Tensor]]:
        if is_any_sampled not in self._samplers:
            rows = self._static_sampling_rows(is_any_sampled)
            self._samplers[is_any_sampled] = capture_graph(lambda: sample(self._logits, rows), self._pool)
        return self._samplers[is_any_sampled]

    # -- the runner interface Verifier uses --------------------------------------------------------
    def canonical_inputs(self, segments: list[Segment], kv: KVStoreProtocol, num_rows: int) -> StepInputs:
        if num_rows != self.num_rows:
            raise ValueError(f"this canonical graph has R = {self.num_rows} rows, asked for {num_rows}")
        if kv is not self._kv:
            self._bind(kv)
        tokens, positions, slots, tables, table_of_row = [], [], [], [], []
        for i, seg in enumerate(segments):
            tokens += seg.tokens
            positions += range(seg.start, seg.end)
            slots += kv.slots(seg.rid, seg.start, seg.end)
            tables.append(kv.block_table(seg.rid))
            table_of_row += [i] * len(seg.tokens)
        if len(tokens) > num_rows:
            raise ValueError(f"canonical pass got {len(tokens)} rows, more than R = {num_rows}")
        max_context_len = self._rows.stage(kv, tokens, positions, slots, tables, table_of_row)
        return dataclasses.replace(self._inputs, max_context_len=max_context_len)

    def sampling_rows(self, per_row: list[tuple[SamplingParams, int, int]], num_rows: int) -> SamplingRows:
        pad = num_rows - len(per_row)
        ints, floats = self._staging_ints.host(), self._staging_floats.host()
        ints[0] = torch.tensor([p.top_k for p, _, _ in per_row] + [0] * pad)
        ints[1] = torch.tensor([s for _, s, _ in per_row] + [0] * pad)
        ints[2] = torch.tensor([q for _, _, q in per_row] + [0] * pad)
        floats[0] = torch.tensor([p.temperature for p, _, _ in per_row] + [0.0] * pad)
        floats[1] = torch.tensor([p.top_p for p, _, _ in per_row] + [1.0] * pad)
        self._staging_ints.copy()
        self._staging_floats.copy()
        self._is_any_sampled = any(p.temperature > 0 for p, _, _ in per_row)
        return self._static_sampling_rows(self._is_any_sampled)

    def run(self, inputs: StepInputs, kv: KVStoreProtocol, policy: ReductionPolicy,
            rows: SamplingRows) -> StepOutput:
        if kv is not self._kv or inputs.token_ids is not self._inputs.token_ids:
            raise ValueError("CanonicalGraph.run needs the inputs staged by its own canonical_inputs")
        if policy is not self.policy:
            raise ValueError(f"this canonical graph was captured with {self.policy!r}, not {policy!r}")
        if self.is_graphed:
            tokens, logprobs = self.replay()
        else:
            logits = forward(self.runner.weights, self.runner.cfg, inputs, kv.layers(), policy)
            tokens, logprobs = sample(logits, self._static_sampling_rows(self._is_any_sampled))
        return StepOutput(tokens.tolist(), logprobs.tolist())

    def replay(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Replay forward + sampler on the staged pass; returns the static (tokens [R], log-probs [R])."""
        self._forward_graph.replay()
        graph, outputs = self._sampler(self._is_any_sampled)
        graph.replay()
        return outputs


class GraphVerifier(Verifier):
    """The Verifier over a CUDA-graph-captured canonical pass (same ``verify(work, kv)`` contract).

    ``use_graph=None`` captures on CUDA and runs the static-buffer pass eagerly elsewhere.
    """

    def __init__(self, runner: ModelRunner, policy: ReductionPolicy, config: CanonicalConfig, *,
                 use_graph: bool | None = None):
        super().__init__(runner, policy, config)  # validates the policy
        self.graph = CanonicalGraph(runner, policy, config.num_rows, use_graph=use_graph)
        self.runner = self.graph


def decode_buckets(max_batch_size: int) -> tuple[int, ...]:
    """Batch sizes with a captured decode graph: 1, 2, 4, 8, then every multiple of 16 up to the maximum."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_batch_size]
    sizes += list(range(16, max_batch_size, 16))
    return tuple(sizes) + (max_batch_size,)


class DecodeGraphs:
    """The fast path's decode step (one token row per sequence) as one CUDA graph per batch bucket.

    Captured on first use, largest bucket first, into one shared pool. A step
    of n sequences replays the smallest bucket >= n; its padding rows write
    scratch slots. Attention's split count is fixed per bucket at capture (from
    the model's context length), and each sequence cuts its own context into
    that many chunks on the device.
    """

    def __init__(self, runner: ModelRunner, policy: ReductionPolicy, kv: KVStoreProtocol, *, max_batch_size: int):
        if not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise ValueError(f"max_batch_size must be a positive integer, got {max_batch_size!r}")
        if runner.device.type != "cuda":
            raise ValueError(f"decode CUDA graphs need a CUDA device, the model is on {runner.device}")
        self.runner = runner
        self.policy = policy
        self.kv = kv
        self.buckets = decode_buckets(max_batch_size)
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}

    @property
    def max_batch_size(self) -> int:
        return self.buckets[-1]

    @property
    def is_captured(self) -> bool:
        return bool(self._graphs)

    def can_run(self, segments: list[Segment], kv: KVStoreProtocol) -> bool:
        return (kv is self.kv and 0 < len(segments) <= self.max_batch_size
                and all(len(seg.tokens) == 1 for seg in segments))

    def bucket_for(self, num_seqs: int) -> int:
        return next(b for b in self.buckets if b >= num_seqs)

    def bucket_inputs(self, bucket: int) -> StepInputs:
        rows = self._rows
        return StepInputs(
            token_ids=rows.view("token_ids", bucket),
            positions=rows.view("positions", bucket),
            slot_mapping=rows.view("slot_mapping", bucket),
            row_seq=rows.row_seq[:bucket],
            block_tables=rows.block_tables[:bucket],
            context_lens=rows.view("context_lens", bucket),
            seq_starts=tuple(range(bucket + 1)),
            max_context_len=self.runner.cfg.max_position_embeddings,
            logits_rows=None,
        )

    def capture(self) -> None:
        cfg = self.runner.cfg
        max_blocks = -(-cfg.max_position_embeddings // self.kv.block_size)
        self._rows = _StaticRows(self.max_batch_size, max_blocks, self.kv, self.runner.device)
        layers = self.kv.layers()
        pool = torch.cuda.graph_pool_handle()
        for bucket in reversed(self.buckets):
            inputs = self.bucket_inputs(bucket)
            self._graphs[bucket] = capture_graph(
                lambda: forward(self.runner.weights, cfg, inputs, layers, self.policy), pool
            )
        torch.cuda.synchronize()

    def forward(self, segments: list[Segment], kv: KVStoreProtocol) -> torch.Tensor:
        """Logits [len(segments), V] of one decode step, by graph replay (positions already appended in ``kv``)."""
        if not self.can_run(segments, kv):
            raise ValueError("DecodeGraphs.forward needs 1..max_batch_size single-token segments on its K/V store")
        if not self._graphs:
            self.capture()
        bucket = self.bucket_for(len(segments))
        tokens = [seg.tokens[0] for seg in segments]
        positions = [seg.start for seg in segments]
        slots = [kv.slots(seg.rid, seg.start, seg.end)[0] for seg in segments]
        tables = [kv.block_table(seg.rid) for seg in segments]
        self._rows.stage(kv, tokens, positions, slots, tables, list(range(len(segments))), num_rows=bucket)
        return self.replay(len(segments))

    def replay(self, num_seqs: int) -> torch.Tensor:
        """Replay the bucket for ``num_seqs`` on the staged inputs; returns logits [num_seqs, V]."""
        graph, logits = self._graphs[self.bucket_for(num_seqs)]
        graph.replay()
        return logits[:num_seqs]
