"""The Verifier: runs canonical passes over verify windows and prompt chunks, then commits/rolls back."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llm42.policies.base import ReductionPolicy
from llm42.runner import ModelRunner, Segment
from llm42.verify.canonical_pass import CanonicalPass
from llm42.verify.pass_result import PassResult
from llm42.verify.sampling_runs import SamplingRuns
from llm42.verify.windows import CanonicalConfig, Commit, commit_window


@dataclass(frozen=True)
class CanonicalWork:
    """One request's rows in a canonical pass.

    A verify window (``is_prefill=False``): the last committed token plus its
    candidates. A prompt chunk (``is_prefill=True``): prompt tokens; when
    ``is_last_chunk`` the last row's canonical token is the first output token.
    """

    segment: Segment
    is_prefill: bool
    is_last_chunk: bool = False


@dataclass
class LaunchedPass:
    """A canonical pass on its way: its work and the device result to read."""

    work: list[CanonicalWork]
    result: PassResult

    def is_ready(self) -> bool:
        return self.result.is_ready()

    def advance(self) -> None:
        """A sliced pass's next slice (``CanonicalPass(num_slices=)``); nothing for another pass."""
        advance = getattr(self.result, "advance", None)
        if advance is not None:
            advance()


class Verifier:
    """Runs canonical passes of R rows (up to ``max_rows``, a multiple of R) with a shape-closed policy.

    ``launch`` stages and starts a pass (on its own CUDA stream, so free requests'
    fast steps keep running); ``finish`` waits for it and applies the commit rule,
    rolling back each request's K/V to its committed prefix. ``verify`` is the two
    in one. ``use_graph=None`` captures the pass as a CUDA graph on CUDA and runs the
    same static-buffer pass eagerly elsewhere; ``use_thread=True`` runs it there on a worker thread
    (``CanonicalPass``). ``max_model_len``: the longest sequence a
    pass's row may belong to (default: the model's context; ``DVRGenerator`` passes its own).
    ``num_sms`` (CUDA, with ``use_stream``): the passes' kernels run on that many SMs (``CanonicalPass``);
    ``sms_max_rows``: only passes of at most that many rows do, wider ones take every SM (``CanonicalPass``).
    ``priority`` (CUDA, with ``use_stream``): the passes' stream priority (``CanonicalPass``; lower is higher);
    ``prompt_priority``: that of the passes that carry prompt chunks (default: ``priority``).
    ``num_slices``: each pass's layers in that many slices, one launched per ``LaunchedPass.advance``
    (``CanonicalPass``).
    """

    def __init__(self, runner: ModelRunner, policy: ReductionPolicy, config: CanonicalConfig, *,
                 use_graph: bool | None = None, use_thread: bool = False, max_model_len: int | None = None,
                 max_rows: int | None = None, use_stream: bool = False, gemm_streams: int | None = None,
                 num_sms: int | None = None, sms_max_rows: int | None = None, priority: int = 0,
                 prompt_priority: int | None = None, num_slices: int = 1):
        if not getattr(policy, "is_shape_closed", False):
            raise ValueError(f"canonical_policy {policy!r} is not shape-closed (is_shape_closed is not True)")
        if use_graph and not getattr(policy, "is_graph_safe", False):
            raise ValueError(f"canonical_policy {policy!r} cannot be captured in a CUDA graph (is_graph_safe)")
        if use_graph is None and not getattr(policy, "is_graph_safe", False):
            use_graph = False
        self.policy = policy
        self.config = config
        self.canonical_pass = CanonicalPass(runner.weights, runner.cfg, policy, config.num_rows, max_rows=max_rows,
                                            use_graph=use_graph, use_stream=use_stream, use_thread=use_thread,
                                            max_model_len=max_model_len, gemm_streams=gemm_streams,
                                            num_sms=num_sms, sms_max_rows=sms_max_rows, priority=priority,
                                            prompt_priority=prompt_priority,
                                            num_slices=num_slices)

    @property
    def max_rows(self) -> int:
        """The most rows one pass takes (R, or a multiple of R for wide prompt passes)."""
        return self.canonical_pass.max_rows

    @property
    def is_graphed(self) -> bool:
        return self.canonical_pass.is_graphed

    @property
    def chains(self) -> bool:
        """Whether a pass may be launched while the one before it is in flight (``CanonicalPass.chains``)."""
        return self.canonical_pass.chains

    def launch(self, work: list[CanonicalWork], kv) -> LaunchedPass:
        segments = [w.segment for w in work]
        for seg in segments:
            kv.append(seg.rid, seg.end)
        # a wide pass's results: every window row, each prompt chunk's last row
        sizes = np.fromiter((len(seg.tokens) for seg in segments), np.int64, len(segments))
        ends = np.cumsum(sizes)
        is_window = np.fromiter((not w.is_prefill for w in work), bool, len(work))
        wanted = np.flatnonzero(np.repeat(is_window, sizes))
        if not is_window.all():
            wanted = np.union1d(wanted, ends[~is_window] - 1)
        urgent = not is_window.all()
        return LaunchedPass(work, self.canonical_pass.launch(segments, kv, SamplingRuns.of_segments(segments),
                                                             wanted=wanted, urgent=urgent))

    def finish(self, launched: LaunchedPass, kv, *, truncate: bool = True) -> list[Commit]:
        """Wait for the pass and apply the commit rule; marks each request's committed prefix canonical.

        ``truncate``: also roll each request's K/V back to its committed prefix (``False``: the caller
        does, e.g. keeping the K/V of candidates drafted ahead of a window that stand).
        """
        tokens, logprobs = launched.result.wait()
        tops = launched.result.top_logprobs()
        commits = []
        row = 0
        for w in launched.work:
            seg = w.segment
            sampled = tokens[row: row + len(seg.tokens)]
            lps = logprobs[row: row + len(seg.tokens)]
            top = None if tops is None else tops[row: row + len(seg.tokens)]
            row += len(seg.tokens)
            if w.is_prefill:
                last = (sampled[-1],) if w.is_last_chunk else ()
                commit = Commit(seg.rid, last, tuple(lps[-1:]) if last else (), 0, 0, seg.end, True,
                                tuple(top[-1:]) if last and top is not None else ())
            else:
                commit = commit_window(seg, sampled, lps, top)
            if truncate and not w.is_prefill:  # a chunk's K/V stands, and a chained chunk's after it
                kv.truncate(seg.rid, commit.num_kv_valid)
            kv.mark_canonical(seg.rid, commit.num_kv_valid)
            commits.append(commit)
        return commits

    def verify(self, work: list[CanonicalWork], kv) -> list[Commit]:
        """One canonical pass: compute, then commit or roll back each request's rows."""
        return self.finish(self.launch(work, kv), kv)
