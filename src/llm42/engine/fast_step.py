"""The fast step: a plan's decode rows and free prompt chunks launched on the device, and read back later.

Decode rows run from the device-resident ``DecodeState`` (replayed from a ``DecodeGraphs`` bucket on
CUDA); prompt chunks run through ``FastPrefill``'s static buffers on CUDA, else through the runner's
varlen layout. The sampled rows are copied to one of two pinned buffers and read by a later ``read``:
at most one step is in flight while the one before it is read, so two buffers suffice.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from llm42.cuda_graphs import DecodeGraphs, cheapest_buckets
from llm42.engine.config import EngineConfig
from llm42.engine.decode_state import DecodeState, to_device
from llm42.engine.mixed import MixedStep
from llm42.engine.prefill import FastPrefill
from llm42.engine.requests import Request, RequestPool
from llm42.kv import KVStoreProtocol
from llm42.policies.base import ReductionPolicy
from llm42.runner import ModelRunner, Segment
from llm42.sampler import SAMPLING_VARIANTS
from llm42.scheduler import Plan, PrefillChunk
from llm42.verify.pass_result import top_dicts


@dataclass
class FastRecord:
    """A launched fast step: which request each sampled row belongs to, and where its results land."""

    requests: list[Request] = field(default_factory=list)
    device_tokens: list[torch.Tensor] = field(default_factory=list)
    device_logprobs: list[torch.Tensor] = field(default_factory=list)
    host_tokens: torch.Tensor | None = None
    host_logprobs: torch.Tensor | None = None
    event: torch.cuda.Event | None = None
    tops: list[tuple[int, tuple[torch.Tensor, torch.Tensor] | None]] = field(default_factory=list)

    def add(self, requests: list[Request], tokens: torch.Tensor, logprobs: torch.Tensor,
            top: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """``top``: the rows' top-N alternatives (ids, log-probs) [len(requests), N], when computed."""
        for req in requests:
            req.num_pending += 1
        self.requests += requests
        self.device_tokens.append(tokens)
        self.device_logprobs.append(logprobs)
        self.tops.append((len(requests), top))

    def top_logprobs(self) -> list[dict[int, float] | None]:
        """Per request row, its top-N alternatives (None where not computed); after ``wait``."""
        rows: list[dict[int, float] | None] = []
        for num, top in self.tops:
            rows += [None] * num if top is None else top_dicts(top[0][:num], top[1][:num])
        return rows

    def copy_out(self, host_tokens: torch.Tensor, host_logprobs: torch.Tensor) -> None:
        """Start the device -> host copy of every sampled row (asynchronous on CUDA)."""
        n = len(self.requests)
        tokens = torch.cat(self.device_tokens) if len(self.device_tokens) > 1 else self.device_tokens[0]
        logprobs = torch.cat(self.device_logprobs) if len(self.device_logprobs) > 1 else self.device_logprobs[0]
        self.host_tokens, self.host_logprobs = host_tokens[:n], host_logprobs[:n]
        self.host_tokens.copy_(tokens, non_blocking=True)
        self.host_logprobs.copy_(logprobs, non_blocking=True)
        self.tops = [(num, None if top is None else tuple(_to_host(t) for t in top)) for num, top in self.tops]
        if tokens.is_cuda:
            self.event = torch.cuda.Event()
            self.event.record()
        self.device_tokens, self.device_logprobs = [], []

    def wait(self) -> tuple[list[int], list[float]]:
        if self.event is not None:
            self.event.synchronize()
        return self.host_tokens.tolist(), self.host_logprobs.tolist()


def _to_host(t: torch.Tensor) -> torch.Tensor:
    """An asynchronous copy of ``t`` into pinned memory (readable once the step's event has completed)."""
    if not t.is_cuda:
        return t
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host


class FastStep:
    """Launches a plan's fast rows (``launch``) and applies their sampled tokens once read back (``read``).

    Holds the step in flight (``take`` hands it over): ``launch`` leaves what ran there even when
    part of the step raised, so decode rows that ran are still read back. ``max_rows``: the most
    rows one step samples (the size of each pinned read-back buffer). Counts ``stats["fast_steps"]``.
    """

    def __init__(self, runner: ModelRunner, kv: KVStoreProtocol, decode_state: DecodeState,
                 decode_graphs: DecodeGraphs | None, fast_prefill: FastPrefill, policy: ReductionPolicy,
                 pool: RequestPool, *, device: torch.device, max_rows: int, mixed: MixedStep | None = None):
        self._runner = runner
        self._kv = kv
        self._decode_state = decode_state
        self.decode_graphs = decode_graphs
        self.decode_bucket_times: dict[int, float] = {}  # ms per replay of each decode bucket (tune_decode_buckets)
        self.fast_prefill = fast_prefill
        self.mixed = mixed
        self._policy = policy
        self._device = device
        self._pool = pool
        self.in_flight: FastRecord | None = None
        pin = device.type == "cuda"
        # two pinned read-back buffers: one being filled by the step in flight, one being read
        self._readback = [(torch.zeros(max_rows, dtype=torch.int64, pin_memory=pin),
                           torch.zeros(max_rows, dtype=torch.float32, pin_memory=pin)) for _ in range(2)]
        self._readback_turn = 0

    @classmethod
    def of_config(cls, runner: ModelRunner, kv: KVStoreProtocol, decode_state: DecodeState, policy: ReductionPolicy,
                  pool: RequestPool, config: EngineConfig, *, max_model_len: int, use_graphs: bool) -> FastStep:
        """The fast step of an engine of ``config``, with the parts it drives, made here once: the static prompt
        staging (``FastPrefill``) and, where ``use_graphs`` (CUDA) and the policy can be captured, the decode
        graphs per batch bucket and, with ``mixed_steps``, the mixed step's graphs."""
        cfg = runner.cfg
        is_graphed = use_graphs and getattr(policy, "is_graph_safe", False)
        decode_graphs = (DecodeGraphs(decode_state, max_batch_size=min(config.max_num_seqs, config.max_fast_tokens))
                         if is_graphed else None)
        bucket_step = config.bucket_step(cfg)
        fast_prefill = FastPrefill(runner.weights, cfg, kv, policy, max_rows=config.max_fast_tokens,
                                   max_seqs=min(32, config.max_num_seqs), use_graph=is_graphed,
                                   max_model_len=max_model_len, bucket_step=bucket_step)
        is_mixed = is_graphed if config.mixed_steps is None else config.mixed_steps
        mixed = (MixedStep(decode_state, fast_prefill, decode_graphs, use_graph=is_graphed, bucket_step=bucket_step)
                 if is_mixed else None)
        return cls(runner, kv, decode_state, decode_graphs, fast_prefill, policy, pool, device=runner.weights.device,
                   max_rows=config.max_fast_tokens + config.max_num_seqs, mixed=mixed)

    def take(self) -> FastRecord | None:
        """Hand over the step in flight (None when there is none); the caller reads it."""
        record, self.in_flight = self.in_flight, None
        return record

    # -- graphs captured up front (``DVRGenerator.capture_graphs``) ----------------------------------------------
    def capture_decode(self, buckets: Sequence[int] | None = None) -> int:
        """Capture the decode graphs of ``buckets`` (default every bucket), each sampling variant, on padding rows
        only (no request's slot is staged: their K/V goes to the scratch block); the number newly captured. Only
        between steps: no fast step in flight (its rows are staged)."""
        graphs = self.decode_graphs
        if graphs is None:
            return 0
        before = graphs.num_captured
        # the largest first, as the canonical pass does: the graphs share a pool, so the smaller ones' activations
        # can take the memory the larger ones left (replayed one at a time)
        for bucket in sorted(graphs.buckets if buckets is None else buckets, reverse=True):
            for variant in SAMPLING_VARIANTS:
                self._decode_state.stage_batch([], bucket)
                graphs.run(bucket, variant)
        return graphs.num_captured - before

    def capture_prefill(self) -> int:
        """Capture every prompt-row bucket's graph of the fast prefill (each sampling variant) on padding rows; the
        number newly captured."""
        prefill = self.fast_prefill
        graphs = getattr(prefill, "graphs", None)
        if graphs is None:
            return 0
        before = graphs.num_captured
        for bucket in sorted(graphs.buckets, reverse=True):  # the largest first (``capture_decode``)
            for variant in SAMPLING_VARIANTS:
                prefill.stage([], self._kv, bucket=bucket)
                graphs.run(bucket, variant)
        return graphs.num_captured - before

    def capture_mixed(self, decode_buckets: Sequence[int] | None = None) -> int:
        """Capture the mixed step's graphs (each decode bucket of ``decode_buckets``, default all, x each prompt
        bucket x its two sampler variants) on padding rows; the number newly captured."""
        mixed = self.mixed
        graphs = getattr(mixed, "graphs", None)
        if graphs is None:
            return 0
        before = graphs.num_captured
        for decode_bucket in sorted(mixed.decode_buckets() if decode_buckets is None else decode_buckets,
                                    reverse=True):  # the largest first (``capture_decode``)
            for prompt_bucket in sorted(mixed.prefill.graphs.buckets, reverse=True):
                for variant in mixed.MIXED_VARIANTS:
                    self._decode_state.stage_batch([], decode_bucket)
                    mixed.prefill.stage([], self._kv, bucket=prompt_bucket)
                    graphs.run(decode_bucket, prompt_bucket, variant)
        return graphs.num_captured - before

    def tune_decode_buckets(self, *, reps: int = 5, rounds: int = 3) -> dict[int, int]:
        """Time every decode bucket's greedy graph on padding rows (CUDA events, ``reps`` replays, the median of
        ``rounds``: 16 replays a bucket, the start-up's cost), then have each bucket replay the fastest graph of a
        bucket up to 1.25x its size where that one is more than 3 % faster (``cheapest_buckets``); returns that map
        (``DecodeGraphs.bucket_map``). Captures what is not captured yet. Only between steps, as ``capture_decode``.
        Timing-based, so the map may differ from run to run: it moves free rows' fast-path rounding, never a
        committed bit (the canonical pass never reads it)."""
        graphs = self.decode_graphs
        if graphs is None:
            return {}
        graphs.set_bucket_map({})
        greedy = SAMPLING_VARIANTS[0]
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = {}
        for bucket in graphs.buckets:
            self._decode_state.stage_batch([], bucket)
            graphs.run(bucket, greedy)  # captured if it was not
            samples = []
            for _ in range(rounds):
                start.record()
                for _ in range(reps):
                    graphs.run(bucket, greedy)
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) / reps)
            times[bucket] = sorted(samples)[len(samples) // 2]
        graphs.set_bucket_map(cheapest_buckets(times))
        self.decode_bucket_times = times
        return graphs.bucket_map

    def drop_decode_graphs(self) -> None:
        """Run decode rows eagerly from now on (a benchmark whose graph capture failed)."""
        self.decode_graphs = None
        self.mixed = None

    def drop_mixed(self, exc: BaseException) -> None:
        """Run steps with decode rows and prompt chunks as two passes from now on: a mixed graph's capture ran out
        of memory (``exc``). Warns once; ``stats["mixed_dropped"]`` counts it. The decode and prompt graphs stay."""
        self.mixed = None
        self._pool.stats["mixed_dropped"] += 1
        if self._device.type == "cuda":
            torch.cuda.empty_cache()  # what the failed capture and the dropped graphs held
        warnings.warn(f"a mixed step's CUDA graph ran out of memory at capture ({type(exc).__name__}: "
                      f"{str(exc)[:200]}); steps with decode rows and prompt chunks run as two passes from now on. "
                      "A smaller kv_cache_tokens or max_num_seqs leaves the graphs room.", RuntimeWarning,
                      stacklevel=3)

    def launch(self, plan: Plan, prompt_drafts: Sequence[PrefillChunk] = ()) -> None:
        """Queue the plan's fast step on the device (``in_flight``); nothing is read back here.

        ``prompt_drafts``: chunks of deterministic prompts run beside the plan's (``DVRGenerator(prompt_drafts=
        True)``): from each request's ``num_fast_prompt``, advancing it; the chunk that ends a prompt samples the
        request's first draft."""
        if not plan.fast_decode and not plan.fast_prefill and not prompt_drafts:
            return
        running, state = self._pool.running, self._decode_state
        record = FastRecord()
        decode = [running[rid] for rid in plan.fast_decode]
        is_prefilled = False
        try:
            if decode:
                # ``Request.next_position`` and ``DecodeState.ensure_blocks`` inlined: every decode row, every step
                max_position, block_size, known = 0, self._kv.block_size, state.table_lengths()
                for req in decode:
                    position = (req.num_prompt_tokens + len(req.token_ids) + len(req.candidates) + req.num_pending
                                - req.num_discard - (req.ahead_check is not None) - 1)
                    if position // block_size >= known[req.slot]:
                        state.ensure_blocks(req.slot, req.rid, position)
                    if position > max_position:
                        max_position = position
                state.flush()
                segments = self._prefill_segments(plan, prompt_drafts)
                details = self._details(decode)
                if segments and details is None and self._can_mix(decode, segments):
                    self._launch_mixed(decode, max_position + 1, segments, record)
                    is_prefilled = True
                    return
                self._launch_decode(decode, max_position + 1, details, record)
            else:
                segments = self._prefill_segments(plan, prompt_drafts)
            if segments:
                self._launch_prefill(segments, record)
                is_prefilled = True
        finally:
            if record.requests or is_prefilled:
                self._pool.stats["fast_steps"] += 1
            if record.requests:  # decode rows ran: their tokens must be read back even if prefill failed
                buffers = self._readback[self._readback_turn]
                self._readback_turn ^= 1
                record.copy_out(*buffers)
                self.in_flight = record

    def _launch_decode(self, decode: list[Request], max_context_len: int,
                       details: tuple[torch.Tensor | None, int] | None, record: FastRecord) -> None:
        """``details``: ``_details(decode)``."""
        state, graphs = self._decode_state, self.decode_graphs
        num = len(decode)
        use_graph = graphs is not None and num <= graphs.max_batch_size and details is None
        variant = state.stage_batch([r.slot for r in decode], graphs.bucket_for(num) if use_graph else num)
        top = None
        self._pool.stats["filtered_steps"] += variant[1]
        if use_graph:
            tokens, logprobs = graphs.run(num, variant)
        elif details is not None:
            tokens, logprobs, top = state.decode_with_details(
                num, variant=variant, max_context_len=max_context_len, is_processed=details[0],
                num_top=details[1])
        else:
            tokens, logprobs = state.decode(num, variant=variant, max_context_len=max_context_len)
        record.add(decode, tokens, logprobs, top)

    def _can_mix(self, decode: list[Request], segments: list[Segment]) -> bool:
        """Whether decode rows that ask for no details and the prompt chunks run as one pass (``MixedStep``):
        the chunks ask for none either."""
        mixed = self.mixed
        if mixed is None:
            return False
        if self._details([self._pool.running[s.rid] for s in segments]) is not None:
            return False
        return mixed.can_run(len(decode), sum(len(s.tokens) for s in segments), len(segments))

    def _launch_mixed(self, decode: list[Request], max_context_len: int, segments: list[Segment],
                      record: FastRecord) -> None:
        mixed, state = self.mixed, self._decode_state
        variant = state.stage_batch([r.slot for r in decode], mixed.decode_bucket(len(decode)))
        try:
            tokens, logprobs, prompt_tokens, prompt_logprobs = mixed.run(len(decode), variant, max_context_len,
                                                                         segments, self._kv)
        except torch.OutOfMemoryError as exc:
            if mixed.graphs is None:  # eagerly, the step may have run in part: nothing to fall back on
                raise
            # a capture that failed left the decode state as it was (``MixedGraphs.run``) and wrote only K/V the
            # two passes write again: this step and every later one run as two passes
            self.drop_mixed(exc)
            self._launch_decode(decode, max_context_len, None, record)
            self._launch_prefill(segments, record)
            return
        self._pool.stats["mixed_steps"] += 1
        self._pool.stats["filtered_steps"] += mixed.last_variant[1]
        record.add(decode, tokens, logprobs)
        self._prefilled(segments, prompt_tokens, prompt_logprobs, None, record)

    def _prefill_segments(self, plan: Plan, prompt_drafts: Sequence[PrefillChunk] = ()) -> list[Segment]:
        """The plan's prompt chunks, then ``prompt_drafts``', as segments, their positions appended in the K/V
        store."""
        running, state = self._pool.running, self._decode_state
        segments = []
        for chunk in (*plan.fast_prefill, *prompt_drafts):
            req = running[chunk.rid]
            # a free prompt from where its prefill stands; a deterministic one from where the fast path's run of it
            # does (its prefill is the canonical pass's)
            start = req.num_fast_prompt if req.is_deterministic else req.num_prefilled
            seg = Segment(req.rid, tuple(req.prompt[start: start + chunk.num_tokens]), start, req.params, req.seed)
            self._kv.append(req.rid, seg.end)
            state.sync_table(req.slot, req.rid)
            segments.append(seg)
        return segments

    def _launch_prefill(self, segments: list[Segment], record: FastRecord) -> None:
        running = self._pool.running
        num_rows = sum(len(s.tokens) for s in segments)
        details = self._details([running[s.rid] for s in segments])
        top = None
        # on the CPU the varlen layout below is cheaper (padded SDPA per sequence, not per row)
        if self._device.type == "cuda" and self.fast_prefill.can_run(num_rows, len(segments)) and details is None:
            tokens, logprobs = self.fast_prefill.run(segments, self._kv)
        else:
            rows = self._runner.sampling_rows([(s.params, s.seed, s.end) for s in segments], len(segments))
            inputs = self._runner.fast_inputs(segments, self._kv)
            if details is None:
                tokens, logprobs = self._runner.forward_sample(inputs, self._kv, self._policy, rows)
            else:
                tokens, logprobs, top = self._runner.forward_sample_details(inputs, self._kv, self._policy, rows,
                                                                            *details)
        self._prefilled(segments, tokens, logprobs, top, record)

    def _prefilled(self, segments: list[Segment], tokens: torch.Tensor, logprobs: torch.Tensor,
                   top: tuple[torch.Tensor, torch.Tensor] | None, record: FastRecord) -> None:
        """Advance each chunk's request; a chunk that completes its prompt feeds its token to the decode state."""
        running, state = self._pool.running, self._decode_state
        finals, drafts = [], []
        for i, seg in enumerate(segments):
            req = running[seg.rid]
            if req.is_deterministic:  # ``prompt_drafts``: its token is the request's first draft
                req.num_fast_prompt = seg.end
                self._pool.stats["prompt_draft_tokens"] += len(seg.tokens)
                if seg.end == req.num_prompt_tokens:
                    finals.append(i)
                    drafts.append(len(finals) - 1)
                continue
            req.num_prefilled = seg.end
            if not req.is_prefill:
                finals.append(i)
        if finals:
            reqs = [running[segments[i].rid] for i in finals]
            index = to_device(finals, torch.int64, self._device)  # pinned, asynchronous: no wait on the step
            state.set_first_tokens(to_device([r.slot for r in reqs], torch.int64, self._device), tokens[index])
            for req in reqs:
                state.set_next(req.slot, None, len(req.prompt))
            values = logprobs[index]
            if drafts:  # a draft's value is its margin (``DecodeState.draft_values``): a prompt row's is not measured
                values = values.index_fill(0, to_device(drafts, torch.int64, self._device), float("inf"))
            record.add(reqs, tokens[index], values, None if top is None else (top[0][index], top[1][index]))

    def _details(self, reqs: list[Request]) -> tuple[torch.Tensor, int] | None:
        """(is_processed [rows] or None, N) when a free request among ``reqs`` wants processed or top-N log-probs.

        Deterministic requests' fast-path log-probs are never committed, so they never ask.
        """
        if not any(r.wants_fast_details for r in reqs):
            return None
        wanted = [r.wants_fast_details for r in reqs]
        is_processed = [not r.is_deterministic and r.params.is_processed_logprobs for r in reqs]
        num_top = max(r.params.num_top_logprobs for r, w in zip(reqs, wanted) if w)
        return (to_device(is_processed, torch.bool, self._device) if any(is_processed) else None), num_top

    def read(self, record: FastRecord | None, events: dict[int, list[int]],
             finish: Callable[[Request], None]) -> None:
        """Read a fast step's tokens back: candidates of deterministic requests, commits of the others.

        ``finish(req)`` is called for a free request whose token stopped it.
        """
        if record is None:
            return
        tokens, logprobs = record.wait()
        tops = record.top_logprobs()
        pool = self._pool
        running, apply_fast, free = pool.running, pool.apply_fast, pool.apply_free_token
        for req, token, value, top in zip(record.requests, tokens, logprobs, tops):
            req.num_pending -= 1
            if running.get(req.rid) is not req:
                continue  # finished while this token was in flight: it is past the request's end
            if req.num_discard:
                req.num_discard -= 1  # drafted ahead of a window a canonical pass has since rolled back
                continue
            if req.ahead_check is not None:
                if not pool.check_ahead(req, token):  # the drafts ahead of the committed token fall
                    self._decode_state.set_next(req.slot, req.token_ids[-1], req.num_committed - 1)
                continue
            if (free(req, token, value, events) if top is None and not req.is_deterministic
                    else apply_fast(req, token, value, events, top)):
                finish(req)
