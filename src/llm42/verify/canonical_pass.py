"""The canonical pass: one implementation with static buffers, eager on the CPU, captured on CUDA.

``CanonicalPass`` owns exactly R rows of static inputs (token ids, positions, slot
mapping, per-row block tables) and sampling rows. ``stage`` writes a pass's real rows
and dummy padding rows into them; ``run`` computes forward + sampler on them — by
replaying one captured CUDA graph on CUDA (a greedy, a sampling and a filtered-sampling variant of the
sampler, chosen on the host so nothing inside synchronises), eagerly elsewhere. Every
tensor's shape is a function of R and the model only (invariant 2).

``launch`` queues a staged pass (on the caller's stream, or with ``use_stream=True`` on its
own stream after the work already queued, so it sees every K/V write before it), copies the
sampled tokens and log-probs to pinned host memory and records an event; the caller applies
the result when ``is_ready``. On the CPU a pass is computed inside ``launch`` unless
``use_thread=True``: then it runs on one worker thread while the caller goes on (its fast
steps write other requests' K/V slots, never the ones the pass reads or writes), and is
ready when the thread is done — the CPU's counterpart of a pass the device runs while the
host prepares the next step. Where a row asks for processed log-probs or top-N alternatives,
or the caller gives the tokens to score (``targets``), ``llm42.sampler.logprob_details`` runs
on the pass's R logits rows after the sampler (eagerly, also on CUDA: its ops give a row the
same bits at any shape).

A *wide* pass (``max_rows`` > R) takes up to ``max_rows`` rows of prompt chunks and windows in
one launch, in buckets of R, 2R, 4R, ... rows (every multiple of R where no CUDA graph is
captured), for long prompts: every GEMM still runs on
blocks of exactly R rows (``GemmRowBlocks``; once over all the rows where the policy's GEMM
rows are their own at any M: ``FixedShapePolicy(gemm="triton")``, or its library GEMM on blocks of a fixed M,
``gemm_rows=``, with buckets of whole blocks; ``is_gemm_row_invariant``),
and the head and the sampler on R selected rows (``wanted``: each window's rows, each prompt
chunk's last row), so a row gets the bits an R-row pass gives it (position invariance at M = R,
observation O2); attention and the row-wise kernels run over all the bucket's rows at once,
which they compute row by row (the canonical attention kernels' bits are a row's own, whatever
the launch). Where the policy's GEMM rows are their own at any M, the head and the sampler (whose rows
are their own too) run on the wanted rows alone, in 8, 64 or 512 result rows, in an R-row pass as well:
a prompt chunk computes its last row's logits (in 8 result rows), not R rows'. What it saves: an
8,192-token prompt takes 4 launches of 2,048 rows instead of 32 of 256, and its attention
fills the GPU (256 rows give the tiled kernel 128 programs on 132 SMs).

A *sliced* pass (``num_slices`` > 1) runs its layers in that many consecutive slices (``slice_bounds``), each a
graph of its own on CUDA: ``launch`` stages the pass and runs the first slice, each ``PassResult.advance`` the next,
the last one with the head and the sampler; ``wait`` runs what is left. The same kernels on the same inputs in the
same order as the unsliced pass: the same bits. What it is for: an engine that advances the pass once a step
shares the device with one slice of it per fast step instead of the whole pass.
"""

from __future__ import annotations

import contextlib
import dataclasses
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from llm42.cuda_graphs import StaticRows, capture_graph, lend_streams, resolve_use_graph
from llm42.inputs import StepInputs
from llm42.model.config import ModelConfig
from llm42.model.forward import embed_rows, forward, forward_head, forward_layers
from llm42.model.weights import Weights
from llm42.policies.base import ReductionPolicy
from llm42.engine.config import positive_int
from llm42.engine.decode_state import to_device
from llm42.sampler import SamplingRows, logprob_details, sample, sampling_variant
from llm42.verify.pass_result import PassResult
from llm42.verify.pass_shapes import (GemmRowBlocks, bucket_gemm_rows, confined_buckets, pass_buckets, result_sizes,
                                      slice_bounds)
from llm42.verify.sampling_runs import SamplingRuns


# the streams a wide pass's R-row GEMM blocks run on, side by side (``GemmRowBlocks``; the default of
# ``CanonicalPass(gemm_streams=)``; 1 = one block after another on the pass's stream)
GEMM_BLOCK_STREAMS = 1
# whether a pass stages a tile table for the tiled canonical attention (``CanonicalPass(segment_tiles=)``)
SEGMENT_TILES = True


def _are_distinct(rows: np.ndarray) -> bool:
    """Whether ``rows`` holds no value twice (ascending rows, a pass's usual, without sorting)."""
    steps = np.diff(rows)
    return bool((steps > 0).all()) or np.unique(rows).size == rows.size


class _SlicedRun:
    """A sliced pass's slices after the first: ``advance`` launches the next one on the pass's stream (the caller's
    where it has none); the last one runs with the head, the sampler and the copy-out, and fills in the result."""

    def __init__(self, cpass: CanonicalPass, inputs: StepInputs, runs: SamplingRuns, stream):
        self.cpass, self.inputs, self.runs, self.stream = cpass, inputs, runs, stream
        self.next = 1

    def advance(self, result: PassResult) -> None:
        cp = self.cpass
        with _on_stream(self.stream):
            if self.next < cp.num_slices - 1:
                cp._run_slices(self.inputs, self.next, self.next + 1)
                self.next += 1
                return
            tokens, logprobs, top = cp._run_with_details(self.inputs, self.runs, None, start=self.next)
            if tokens.is_cuda:
                event = cp._copy_out(tokens, logprobs)
                result.fill(*cp._host_results(), event, top)
            else:
                result.fill(tokens, logprobs, None, top)


def _on_stream(stream):
    """``torch.cuda.stream(stream)``, or nothing where there is no stream."""
    return contextlib.nullcontext() if stream is None else torch.cuda.stream(stream)


class CanonicalPass:
    """``num_rows`` (R) rows of forward + sampler through a shape-closed policy; up to ``max_rows``.

    ``max_rows`` (a multiple of R, default R): the most rows one pass takes; a pass of more than R
    rows runs at the smallest bucket (``pass_buckets``) that holds them, its GEMMs on R-row blocks
    and its head and sampler on the R rows ``wanted`` (see the module docstring). ``max_model_len``:
    the longest sequence a row may belong to (default: the model's context); it sizes the per-row
    block tables, never a kernel's schedule (a row reads only its own positions). ``gemm_streams``
    (CUDA; default ``GEMM_BLOCK_STREAMS``): the streams of its own on which a wide pass's R-row GEMM
    blocks run side by side (``GemmRowBlocks``: the same calls, the same bits; 1 = in turn).
    ``segment_tiles`` (CUDA; default ``SEGMENT_TILES``): stage a tile table with each pass so that the tiled
    canonical attention cuts each sequence's rows into tiles of their own (the same bits as its fixed tiling,
    whose tiles straddle two windows: two key sweeps one after the other in one program).
    ``num_sms`` (CUDA, with ``use_stream``): the pass's streams belong to green contexts of that many SMs
    (``llm42.cuda_graphs.lend_streams``), so its kernels, captured there, never hold more of the device than
    that while fast steps run beside them; ``None``: every SM. A kernel's grid and what each of its programs
    computes do not depend on which SMs run it: the same bits (tests/gpu/test_canonical_sms_cuda.py).
    ``sms_max_rows`` (with ``num_sms``): only passes of at most this many rows (their bucket's) are confined; a wider
    pass, which a backlog of deterministic work fills, runs on an ordinary stream of its own with every SM
    (``confined_buckets``: each bucket's graphs are captured on the stream it runs on, since a graph keeps the SMs of
    the stream it was captured on wherever it is replayed). At least R; ``None``: every pass confined.
    ``priority`` (CUDA, with ``use_stream``): the CUDA stream priority of the pass's streams (lower is higher;
    0, the default, is the lowest, as a fast step's stream has by default; ``-1`` is in every device's range):
    whenever the pass and a fast step both have blocks waiting, the SMs go to the higher. ``prompt_priority``
    (default: ``priority``): that of a pass launched ``urgent`` (``Verifier``: one carrying prompt chunks), on a
    second stream of the pass's, queued behind every pass before it. It only orders independent work on the
    device: the same bits (tests/gpu/test_canonical_stream_cuda.py).
    ``num_slices`` (default 1): run the layers in that many slices, the first at ``launch``, each next one at
    ``PassResult.advance`` (see the module docstring); at most the model's layers; not with ``use_thread``. A sliced
    pass does not chain (its static inputs are read until its last slice).
    """

    def __init__(self, weights: Weights, cfg: ModelConfig, policy: ReductionPolicy, num_rows: int, *,
                 max_rows: int | None = None, use_graph: bool | None = None, use_stream: bool = False,
                 use_thread: bool = False, max_model_len: int | None = None, gemm_streams: int | None = None,
                 segment_tiles: bool | None = None, num_sms: int | None = None, sms_max_rows: int | None = None,
                 priority: int = 0, prompt_priority: int | None = None, num_slices: int = 1):
        self.num_slices = positive_int("CanonicalPass", "num_slices", num_slices)
        if self.num_slices > len(weights.layers):
            raise ValueError(f"CanonicalPass num_slices ({num_slices}) exceeds the model's {len(weights.layers)} "
                             f"layers")
        if self.num_slices > 1 and use_thread:
            raise ValueError("CanonicalPass num_slices > 1 runs a pass's slices on later steps: not with "
                             "use_thread (a pass on a worker thread)")
        self._bounds = slice_bounds(len(weights.layers), self.num_slices)
        self._slice_graphs: dict[tuple[int, int], list[torch.cuda.CUDAGraph]] = {}
        self._slice_states: dict[tuple[int, int], list] = {}  # each slice graph's static output, kept alive
        self._state = None  # an eager sliced pass's residual stream between its slices
        self.weights = weights
        self.cfg = cfg
        self.max_model_len = cfg.max_position_embeddings if max_model_len is None else max_model_len
        self.policy = policy
        self.num_rows = num_rows
        max_rows = num_rows if max_rows is None else max_rows
        if max_rows < num_rows or max_rows % num_rows:
            raise ValueError(f"a canonical pass's max_rows ({max_rows}) must be a multiple of R = {num_rows}")
        self.max_rows = max_rows
        self.device = weights.device
        self.is_graphed = resolve_use_graph(use_graph, self.device)
        self.buckets = pass_buckets(num_rows, max_rows, is_graphed=self.is_graphed,
                                    gemm_rows=bucket_gemm_rows(policy, self.device, num_rows))
        check = getattr(policy, "check_gemm_rows", None)  # a fixed GEMM M's premise, on this device (raises)
        if callable(check):
            check(weights)
        # a row's GEMMs (and head) give it the same bits at any number of rows: each GEMM runs once over a wide
        # pass's rows, and a pass computes results for its wanted rows only (result_sizes)
        self.is_row_invariant = bool(getattr(policy, "is_gemm_row_invariant", False))
        self._kv = None
        # (bucket, result rows) -> (graph, logits)
        self._forward_graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._samplers: dict[tuple[tuple[int, int], bool, bool],
                             tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, torch.Tensor]]] = {}
        self._pool = None
        self._variant = (False, False)  # (any row sampled, any sampled row filtered)
        self._bucket = num_rows  # the bucket staged last
        self._results = num_rows  # the result rows of the pass staged last (head and sampler)
        self._wanted: np.ndarray | None = None  # the pass rows a wide staged pass computes results for
        self._runs = SamplingRuns.of_rows(None)  # the staged pass's result rows' sampling parameters
        is_cuda = self.device.type == "cuda"
        # its own stream only on request. Round 2 ran the pass on a side stream next to replayed fast steps
        # and got a wrong sampled needle and a hang: every graph had been captured on torch's one default
        # capture stream, so the pass's GEMMs and the fast steps' shared one cuBLAS workspace (capture_graph).
        # The pass's graphs are now captured on its own stream (its own workspace); on the H200 that is
        # not verified yet, so by default a pass still shares the caller's stream
        self.num_sms = None if num_sms is None else positive_int("CanonicalPass", "num_sms", num_sms)
        if self.num_sms is not None and is_cuda and not use_stream:
            raise ValueError("CanonicalPass num_sms confines the pass's own stream: it needs use_stream=True")
        prompt_priority = priority if prompt_priority is None else prompt_priority
        for name, value in (("priority", priority), ("prompt_priority", prompt_priority)):
            if isinstance(value, bool) or not isinstance(value, int) or value > 0:
                raise ValueError(f"CanonicalPass {name} must be an int <= 0 (CUDA's stream priorities: lower is "
                                 f"higher), got {value!r}")
        if (priority or prompt_priority) and self.num_sms is not None:
            raise ValueError("CanonicalPass priority does not apply to green-context streams: pass priority or "
                             "num_sms, not both")
        if (priority or prompt_priority) and is_cuda and not use_stream:
            raise ValueError("CanonicalPass priority is the pass's own stream's: it needs use_stream=True")
        self.priority, self.prompt_priority = priority, prompt_priority
        self.sms_max_rows = None if sms_max_rows is None else positive_int("CanonicalPass", "sms_max_rows",
                                                                            sms_max_rows)
        if self.sms_max_rows is not None:
            if self.num_sms is None:
                raise ValueError("CanonicalPass sms_max_rows bounds the passes num_sms confines: it needs num_sms")
            if self.sms_max_rows < num_rows:
                raise ValueError(f"CanonicalPass sms_max_rows ({self.sms_max_rows}) is under R = {num_rows}: no "
                                 f"pass would be confined")
        sms = self.num_sms if is_cuda else None
        self._stream = (lend_streams(self, self.device, 1, priority=priority, num_sms=sms)[0]
                        if is_cuda and use_stream else None)
        # the buckets whose passes run on the green context (the others on ``_wide_stream``, every SM)
        self.confined_buckets = (confined_buckets(self.buckets, self.sms_max_rows)
                                 if self._stream is not None and sms is not None else ())
        is_split = 0 < len(self.confined_buckets) < len(self.buckets)
        self._wide_stream = lend_streams(self, self.device, 1)[0] if is_split else None
        # an urgent pass's stream (prompt_priority), or the pass's one stream
        self._urgent_stream = (lend_streams(self, self.device, 1, priority=prompt_priority)[0]
                               if self._stream is not None and prompt_priority != priority else self._stream)
        self._last_stream = self._stream  # the stream the pass before ran on: the next one queues behind it
        self.segment_tiles = SEGMENT_TILES if segment_tiles is None else segment_tiles
        self.gemm_streams = positive_int("CanonicalPass", "gemm_streams",
                                         GEMM_BLOCK_STREAMS if gemm_streams is None else gemm_streams)
        # the pass's own while it lives (never another live pass's: a captured GEMM keeps its stream's workspace)
        has_blocks = is_cuda and self.gemm_streams > 1 and max_rows > num_rows
        self._block_streams = (lend_streams(self, self.device, self.gemm_streams, priority=priority, num_sms=sms)
                               if has_blocks else [])
        # a wide pass on every SM splits its GEMM blocks over ordinary streams (a green one's would confine them)
        self._wide_block_streams = (lend_streams(self, self.device, self.gemm_streams)
                                    if has_blocks and is_split else [])
        self._use_thread = use_thread and not is_cuda  # a CUDA pass is already asynchronous: the device runs it
        self._worker: ThreadPoolExecutor | None = None  # started by the first threaded launch
        # pinned result rows, two sets used in turn: a pass chained behind another copies its results out
        # before the host has read the other's
        self._host_out = [(torch.zeros(max_rows, dtype=torch.int64, pin_memory=is_cuda),
                           torch.zeros(max_rows, dtype=torch.float32, pin_memory=is_cuda)) for _ in range(2)]
        self._num_launched = 0
        self._pending: PassResult | None = None

    @property
    def chains(self) -> bool:
        """Whether ``launch`` may stage a pass while the one before it runs: on CUDA every write of the static
        buffers (their one ``PackedStaging`` copy, the rows' table gather) is queued on the stream behind the pass
        before, and the result rows alternate between two pinned buffers, so at most two passes may be in flight (the
        caller applies the older one before launching a third). On the CPU a launch waits for the pass before, and
        so does a sliced pass's (its static inputs are read until its last slice)."""
        return self.device.type == "cuda" and self.num_slices == 1

    def bucket_for(self, num_real: int) -> int:
        """The rows a pass of ``num_real`` real rows computes."""
        return next(b for b in self.buckets if b >= num_real)

    def results_for(self, bucket: int, num_wanted: int) -> int:
        """The result rows a pass of ``bucket`` rows computes for ``num_wanted`` wanted rows."""
        return next(n for n in self._result_sizes(bucket) if n >= num_wanted)

    def _result_sizes(self, bucket: int) -> tuple[int, ...]:
        return result_sizes(self.num_rows, bucket, is_graphed=self.is_graphed, is_row_invariant=self.is_row_invariant)

    def _keys(self) -> list[tuple[int, int]]:
        return [(b, n) for b in self.buckets for n in self._result_sizes(b)]

    # -- static buffers and capture ---------------------------------------------------------------
    @property
    def num_captured(self) -> int:
        """The graphs captured for the store bound now (forward passes, slices and sampler variants)."""
        slices = sum(map(len, self._slice_graphs.values()))  # a sliced pass's: its last also in _forward_graphs
        return (slices or len(self._forward_graphs)) + len(self._samplers)

    def bind(self, kv) -> int:
        """Bind ``kv`` now (static buffers, and on CUDA every bucket's graphs), as the first pass staged for it
        would; the number of graphs captured (0: bound already)."""
        if kv is self._kv:
            return 0
        self._bind(kv)
        return self.num_captured

    def _bind(self, kv) -> None:
        """Allocate static buffers for ``kv`` and (on CUDA) capture the forward pass of every bucket.

        Every bucket at once (on the dummy rows), as a serving engine captures its graphs at start-up:
        a bucket captured when a pass first needs it would stall that pass (and every request behind it).
        """
        cfg, num_rows, device = self.cfg, self.num_rows, self.device
        # a pass's sequences: at most R (each takes a row of an R-row pass, a result row of a wider one)
        tile_rows = None
        if device.type == "cuda" and self.segment_tiles:
            rows_of = getattr(self.policy, "attention_tile_rows", None)
            tile_rows = rows_of(cfg.num_heads, cfg.num_kv_heads) if callable(rows_of) else None
        max_rows = self.max_rows  # every row of a wide pass may need a result (its windows' rows)
        # the pass's own regions in its rows' one copy: the result rows' sampling parameters and a wide pass's logits
        # rows (``_select``)
        extra = (("sampling_ints", (3, max_rows), torch.int64),  # top_k, seeds, positions
                 ("sampling_floats", (2, max_rows), torch.float32),  # temperature, top_p
                 ("select", (max_rows,), torch.int64))
        self._rows = StaticRows(max_rows, self.max_model_len, kv, device, max_seqs=num_rows, tile_rows=tile_rows,
                                extra=extra)
        packed = self._rows.packed
        self._sampling_ints, self._sampling_floats = packed.device("sampling_ints"), packed.device("sampling_floats")
        self._select = packed.device("select")
        self._sampling_floats[1] = 1.0
        packed.host("sampling_floats")[1] = 1.0
        # every key's inputs now where graphs are captured for each; eagerly (the CPU) each when first staged:
        # with R = 1 the keys number in the hundred thousands, and a pass meets few of them
        self._inputs: dict[tuple[int, int], StepInputs] = {}
        if self.is_graphed:
            for key in self._keys():
                self._key_inputs(key)
        # a policy whose GEMM rows are their own at any M (FixedShapePolicy(gemm="triton")) runs each GEMM once
        self._policies = {bucket: self.policy if bucket == num_rows or self.is_row_invariant
                          else GemmRowBlocks(self.policy, num_rows, streams=self._block_streams_for(bucket))
                          for bucket in self.buckets}
        self._kv = kv
        self._samplers.clear()
        self._forward_graphs.clear()
        self._slice_graphs.clear()
        self._slice_states.clear()
        if self.is_graphed:
            self._pool = torch.cuda.graph_pool_handle()
            for key in reversed(self._keys()):  # the largest first: the others reuse its pool memory
                self._capture(key)
            for key in self._keys():  # and each one's sampler variants (greedy, sampled, filtered), not mid-run
                for variant in ((False, False), (True, False), (True, True)):
                    self._variant = variant
                    self._sampler(key)
            self._variant = (False, False)

    def _key_inputs(self, key: tuple[int, int]) -> StepInputs:
        """The static inputs of ``key`` = (bucket rows, result rows); max_context_len is a bound (CUDA kernels
        never read it), which stage() replaces with the pass's own."""
        if key not in self._inputs:
            bucket, n = key
            every_row = n == bucket == self.num_rows  # an R-row pass's results in row order
            self._inputs[key] = self._rows.inputs(bucket, max_context_len=self.max_model_len,
                                                  logits_rows=None if every_row else self._select[:n])
        return self._inputs[key]

    def _forward(self, bucket: int, inputs: StepInputs) -> torch.Tensor:
        return forward(self.weights, self.cfg, inputs, self._kv.layers(), self._policies[bucket])

    def _forward_slice(self, bucket: int, inputs: StepInputs, k: int, state):
        """Slice ``k`` of the forward pass: its layers from ``state`` (the first slice from the embeddings); the
        last slice also runs the head and returns the logits."""
        policy, kv = self._policies[bucket], self._kv.layers()
        if k == 0:
            state = embed_rows(self.weights, inputs)
        state = forward_layers(self.weights, self.cfg, inputs, kv, policy, state, self._bounds[k], self._bounds[k + 1])
        if k == self.num_slices - 1:
            return forward_head(self.weights, self.cfg, inputs, policy, state)
        return state

    def _capture(self, key: tuple[int, int]) -> None:
        """Capture the forward pass of ``key`` = (bucket rows, result rows); its warm-up runs the dummy rows
        staged at bind time (their K/V goes to the scratch slots). A sliced pass: a graph per slice, each reading
        the static output of the one before."""
        inputs = self._key_inputs(key)
        if self.num_slices == 1:
            self._forward_graphs[key] = capture_graph(lambda: self._forward(key[0], inputs), self._pool,
                                                      stream=self._stream_for(key[0]))
            return
        graphs, states, state = [], [], None
        for k in range(self.num_slices):
            graph, state = capture_graph(lambda k=k, state=state: self._forward_slice(key[0], inputs, k, state),
                                         self._pool, stream=self._stream_for(key[0]))
            graphs.append(graph)
            states.append(state)
            if k < self.num_slices - 1:  # on the dummy rows: the next slice warms up on real values, not on what
                graph.replay()  # its freshly allocated input held (its warm-up writes the scratch K/V slots too)
        # every slice's static output is kept alive (``_slice_states``): a later capture in the shared pool must
        # not take its memory, which the next slice reads a step later
        self._slice_graphs[key] = graphs
        self._slice_states[key] = states
        self._forward_graphs[key] = (graphs[-1], state)  # the last slice's logits: what the sampler reads

    def _sampling_rows(self, start: int = 0, end: int | None = None) -> SamplingRows:
        """The sampling parameters of result rows ``start .. end`` (default: the staged pass's)."""
        end = self._results if end is None else end
        ints, floats = self._sampling_ints[:, start:end], self._sampling_floats[:, start:end]
        return SamplingRows(temperature=floats[0], top_k=ints[0], top_p=floats[1], seeds=ints[1],
                            positions=ints[2], is_any_sampled=self._variant[0],
                            is_any_filtered=self._variant[1])

    def _sample(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The sampler on blocks of R result rows, each the call an R-row pass makes (so each row gets its bits);
        fewer than R result rows (a row-invariant head's, ``result_sizes``) in one call: its rows are its own too."""
        r, n = self.num_rows, logits.shape[0]
        if n <= r:
            return sample(logits, self._sampling_rows(0, n))
        parts = [sample(logits[i: i + r], self._sampling_rows(i, i + r)) for i in range(0, n, r)]
        return torch.cat([t for t, _ in parts]), torch.cat([lp for _, lp in parts])

    def _sampler(self, key: tuple[int, int]) -> tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, torch.Tensor]]:
        skey = (key, *self._variant)
        if skey not in self._samplers:
            logits = self._forward_graphs[key][1]
            self._samplers[skey] = capture_graph(lambda: self._sample(logits), self._pool,
                                                 stream=self._stream_for(key[0]))
        return self._samplers[skey]

    # -- staging and running -----------------------------------------------------------------------
    def stage(self, segments, kv, per_row=None, *, wanted=None) -> StepInputs:
        """Write ``segments``' rows (then dummy rows) into the static buffers; returns the pass's inputs.

        ``per_row``: the real rows' sampling parameters, a ``SamplingRuns`` or a list of (params, seed,
        position of the sampled token) per row; None stages greedy rows. The segments' positions must already
        be appended in ``kv``. ``wanted``: the rows (pass indices, a list or an int64 array) whose results a pass
        of more than R rows computes, in blocks of R (``results_for``); default each segment's last row. A pass
        of at most R rows computes every row's, unless its head rows are their own at any number of rows
        (``is_row_invariant``) and ``wanted`` names fewer than R: then those rows' only (8, 64 or 512 result rows,
        ``result_sizes``).
        """
        if self._pending is not None and self._pending.has_pending_slices:
            self._pending._complete()  # a sliced pass still reads the static buffers: its slices run first
        if kv is not self._kv:
            self._bind(kv)
        num_real = sum(len(seg.tokens) for seg in segments)
        if num_real > self.max_rows:
            raise ValueError(f"canonical pass got {num_real} rows, more than its {self.max_rows} "
                             f"(R = {self.num_rows})")
        bucket = self.bucket_for(num_real)
        max_context_len, lasts = self._rows.stage_segments(kv, segments, num_rows=bucket, send=False)
        runs = per_row if isinstance(per_row, SamplingRuns) else SamplingRuns.of_rows(per_row)
        if len(runs) not in (0, num_real):
            raise ValueError(f"a canonical pass's sampling rows ({len(runs)}) must be one per real row ({num_real})")
        num_wanted = num_real if wanted is None else len(wanted)
        if bucket == self.num_rows and (wanted is None or self.results_for(bucket, num_wanted) == bucket):
            self._wanted = None  # every row's result, in row order
            results = self.num_rows
        else:
            rows = np.asarray(lasts if wanted is None else wanted, dtype=np.int64)
            if rows.size > num_real or (rows.size and (rows.min() < 0 or rows.max() >= num_real
                                                       or not _are_distinct(rows))):
                raise ValueError(f"a wide canonical pass computes results for distinct rows among its {num_real} "
                                 f"real rows, got {rows.size} wanted rows")
            results = self.results_for(bucket, rows.size)
            # rows past the result rows are never read: only the first ``results`` are gathered
            select = self._rows.packed.host("select")
            select[: rows.size] = rows
            select[rows.size: results] = 0
            runs = runs.take(rows) if len(runs) else runs
            self._wanted = rows
        self._stage_sampling(runs, results)
        self._rows.send()  # the rows, the tiles, the tables, the sampling and result rows: one copy
        self._runs = runs
        self._bucket, self._results = bucket, results
        return dataclasses.replace(self._key_inputs((bucket, results)), max_context_len=max_context_len)

    def _stage_sampling(self, runs: SamplingRuns, num_results: int) -> None:
        """The sampling rows of the pass's ``num_results`` result rows (padding: greedy); rows past them
        keep stale values nobody reads (the sampler reads the first ``num_results``). Written per run of rows
        (``np.repeat``), the positions per row; into the host regions, which ``stage`` then sends."""
        n = len(runs)
        ints, floats = self._sampling_host()
        ints[:, n:num_results] = 0
        floats[0, n:num_results] = 0.0
        floats[1, n:num_results] = 1.0
        if n:
            params = runs.params
            ints[0, :n] = runs.per_run([p.top_k for p in params])
            ints[1, :n] = runs.per_run(runs.seeds)
            ints[2, :n] = runs.positions
            # float64 -> float32 rounds to nearest, as torch.tensor on the Python floats does
            floats[0, :n] = runs.per_run([float(p.temperature) for p in params])
            floats[1, :n] = runs.per_run([float(p.top_p) for p in params])
        self._variant = sampling_variant(runs.params)

    def _sampling_host(self) -> tuple[np.ndarray, np.ndarray]:
        """The host regions of the sampling rows: (top_k, seed, position) and (temperature, top_p) per result row."""
        packed = self._rows.packed
        return packed.host("sampling_ints"), packed.host("sampling_floats")

    def run(self, inputs: StepInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward + sampler on the staged pass; returns (tokens, log-probs): per row of an R-row pass
        ([R]), per wanted row of a wider one (then padding rows up to its result rows)."""
        tokens, logprobs, _ = self._run(inputs)
        return tokens, logprobs

    def _run_slices(self, inputs: StepInputs, start: int, end: int) -> torch.Tensor | None:
        """Slices ``start .. end - 1`` of the staged pass; the logits where ``end`` is the last slice's."""
        key = (self._bucket, self._results)
        if self.is_graphed:
            for graph in self._slice_graphs[key][start:end]:
                graph.replay()
            return self._forward_graphs[key][1] if end == self.num_slices else None
        state = self._state
        for k in range(start, end):
            state = self._forward_slice(self._bucket, inputs, k, state)
        self._state = None if end == self.num_slices else state
        return state if end == self.num_slices else None

    def _run(self, inputs: StepInputs, start: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(tokens, log-probs, logits) of the result rows; on CUDA the logits are the graph's static output.
        ``start``: a sliced pass's first slice not yet run."""
        key = (self._bucket, self._results)
        if self.num_slices > 1:
            logits = self._run_slices(inputs, start, self.num_slices)
        elif self.is_graphed:
            self._forward_graphs[key][0].replay()
            logits = self._forward_graphs[key][1]
        else:
            logits = self._forward(self._bucket, inputs)
        if self.is_graphed:
            graph, (tokens, logprobs) = self._sampler(key)
            graph.replay()
            return tokens, logprobs, logits
        tokens, logprobs = self._sample(logits)
        return tokens, logprobs, logits

    def _run_with_details(self, inputs: StepInputs, runs: SamplingRuns, targets: list[int] | None, start: int = 0
                          ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """Run the pass; log-probs in each row's mode, of ``targets`` (first rows) where given, and top-N.
        ``runs``: the result rows' (``stage`` staged them). ``start``: as ``_run``'s."""
        tokens, logprobs, logits = self._run(inputs, start)
        params = runs.params
        num_top = max((p.num_top_logprobs for p in params), default=0)
        is_any_processed = any(p.is_processed_logprobs for p in params)
        if targets is None and num_top == 0 and not is_any_processed:
            return tokens, logprobs, None
        is_processed = None
        if is_any_processed:
            rows = np.zeros(self._results, dtype=bool)
            rows[: len(runs)] = runs.per_run([p.is_processed_logprobs for p in params])
            is_processed = to_device(rows.tolist(), torch.bool, self.device)
        scored = tokens
        if targets is not None:
            scored = tokens.clone()
            scored[: len(targets)] = to_device(targets, torch.int64, self.device)
        chosen, top_ids, top_logprobs = logprob_details(logits, scored, self._sampling_rows(), is_processed, num_top)
        return tokens, chosen, (top_ids, top_logprobs) if num_top else None

    def launch(self, segments, kv, per_row, *, targets: list[int] | None = None,
               wanted: list[int] | None = None, urgent: bool = False) -> PassResult:
        """Stage and run one pass, on its own stream on CUDA; the result is read with ``PassResult.wait``.

        ``targets``: tokens to take the log-probs of, one per leading real row, instead of the sampled ones
        (passes of at most R rows). ``wanted``: as ``stage``'s. ``urgent``: on the stream of ``prompt_priority``.
        """
        if self._pending is not None and not self.chains and not self._pending.is_ready():
            self._pending.wait()  # the static buffers are still in use by the previous pass
        self._num_launched += 1
        if targets is not None and sum(len(seg.tokens) for seg in segments) > self.num_rows:
            raise ValueError(f"scoring targets need a pass of at most R = {self.num_rows} rows")
        if targets is not None and wanted is not None:
            raise ValueError("scoring targets are the leading rows' own: a pass that scores takes no wanted rows")
        if self.num_slices > 1 and targets is None:
            return self._launch_sliced(segments, kv, per_row, wanted=wanted, urgent=urgent)
        if self._use_thread:
            inputs = self.stage(segments, kv, per_row, wanted=wanted)  # the static buffers are written here
            runs = self._runs
            if self._worker is None:
                self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llm42-canonical")
            grad, inference = torch.is_grad_enabled(), torch.is_inference_mode_enabled()

            def run():  # autograd and inference modes are thread-local: the worker takes on the caller's
                with torch.inference_mode(inference), torch.set_grad_enabled(grad):
                    return self._run_with_details(inputs, runs, targets)

            future = self._worker.submit(run)
            self._pending = PassResult(None, None, None, future=future, **self._result_rows())
            return self._pending
        if self._stream is None:
            inputs = self.stage(segments, kv, per_row, wanted=wanted)
            tokens, logprobs, top = self._run_with_details(inputs, self._runs, targets)
            if tokens.is_cuda:
                event = self._copy_out(tokens, logprobs)
                self._pending = PassResult(*self._host_results(), event, top, **self._result_rows())
            else:
                self._pending = PassResult(tokens, logprobs, None, top, **self._result_rows())
            return self._pending
        stream = self._queued_stream(segments, urgent)
        with torch.cuda.stream(stream):
            inputs = self.stage(segments, kv, per_row, wanted=wanted)
            tokens, logprobs, top = self._run_with_details(inputs, self._runs, targets)
            event = self._copy_out(tokens, logprobs)
        self._pending = PassResult(*self._host_results(), event, top, **self._result_rows())
        return self._pending

    def _is_wide(self, bucket: int) -> bool:
        """Whether a pass of ``bucket`` rows takes every SM while ``sms_max_rows`` confines the narrower ones."""
        return self._wide_stream is not None and bucket not in self.confined_buckets

    def _stream_for(self, bucket: int, *, urgent: bool = False) -> torch.cuda.Stream | None:
        """The stream a pass of ``bucket`` rows is captured and runs on (None: the caller's): the wide one for a
        wide bucket (``_is_wide``), else the pass's (green, where ``num_sms``); ``urgent``: the stream of
        ``prompt_priority``."""
        if self._is_wide(bucket):
            return self._wide_stream
        return self._urgent_stream if urgent else self._stream

    def _block_streams_for(self, bucket: int) -> list[torch.cuda.Stream]:
        """The streams a wide pass of ``bucket`` rows runs its R-row GEMM blocks on (``GemmRowBlocks``)."""
        return self._wide_block_streams if self._is_wide(bucket) else self._block_streams

    def _queued_stream(self, segments, urgent: bool) -> torch.cuda.Stream:
        """The stream a pass of ``segments`` runs on, its work queued behind the caller's and behind the pass before
        (its static buffers, its K/V), as on one stream."""
        num_real = sum(len(seg.tokens) for seg in segments)  # past max_rows: stage() raises, naming it
        stream = self._stream_for(self.bucket_for(min(num_real, self.max_rows)), urgent=urgent)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        if stream is not self._last_stream:
            stream.wait_stream(self._last_stream)
        self._last_stream = stream
        return stream

    def _launch_sliced(self, segments, kv, per_row, *, wanted, urgent: bool) -> PassResult:
        """``launch`` of a sliced pass: stage it and run its first slice; ``PassResult.advance`` runs the others."""
        stream = None if self._stream is None else self._queued_stream(segments, urgent)
        with _on_stream(stream):
            inputs = self.stage(segments, kv, per_row, wanted=wanted)
            self._run_slices(inputs, 0, 1)
        self._pending = PassResult(None, None, None, slices=_SlicedRun(self, inputs, self._runs, stream),
                                   **self._result_rows())
        return self._pending

    def _copy_out(self, tokens: torch.Tensor, logprobs: torch.Tensor) -> torch.cuda.Event:
        """Queue the result rows' copy to pinned host memory; the event marks its end."""
        host_tokens, host_logprobs = self._host_results()
        host_tokens.copy_(tokens, non_blocking=True)
        host_logprobs.copy_(logprobs, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return event

    def _host_results(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This launch's pinned result rows (the two sets in turn)."""
        host_tokens, host_logprobs = self._host_out[self._num_launched % 2]
        return host_tokens[: self._results], host_logprobs[: self._results]

    def _result_rows(self) -> dict:
        return {"wanted": self._wanted, "num_rows": self._bucket}

    def close(self) -> None:
        """Wait for a pass in flight and stop the worker thread, if one was started, then drop what the pass holds
        for its K/V store: the captured graphs, their memory pool, the static rows, the store itself (a pass staged
        after this binds and captures again). The caller has applied or dropped its passes (idempotent)."""
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None
        self._pending = None
        for held in (self._forward_graphs, self._samplers, self._slice_graphs, self._slice_states):
            held.clear()
        self._inputs = {}
        self._kv = self._rows = self._pool = None
