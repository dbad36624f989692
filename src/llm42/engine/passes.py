"""CanonicalPasses: the canonical passes in flight and each step's canonical phase.

At most two passes are in flight: the oldest, and one chained behind it (``EngineConfig.chain_passes``: its
staging waits on the device, so the canonical stream goes from one pass to the next without the host's turn
between them). A step's canonical phase launches the plan's pass, chains it behind the one in flight, defers it
(its requests draft ahead meanwhile) or applies the passes before it; applying a pass is the commit rule's
outcome written into the request pool, the K/V store and the fast path's device rows.
"""

from __future__ import annotations

from collections.abc import Callable

from llm42.engine.config import EngineConfig
from llm42.engine.decode_state import DecodeState
from llm42.engine.requests import Request, RequestPool
from llm42.runner import Segment
from llm42.scheduler import Plan
from llm42.verify import CanonicalConfig, CanonicalWork, Commit, LaunchedPass


def _wait_ready(launched: LaunchedPass, timeout_s: float) -> bool:
    """Whether ``launched`` finished within ``timeout_s`` (a result without ``wait_ready``: wait for it)."""
    wait_ready = getattr(launched.result, "wait_ready", None)
    return True if wait_ready is None else wait_ready(timeout_s)


class CanonicalPasses:
    """The canonical passes a generator has in flight, and the verbs of its steps' canonical phases.

    ``verifier``: llm42's ``Verifier`` or a user's (``launch``/``finish``, or ``verify`` alone: synchronous).
    ``is_drafting_ahead``: requests draft ahead of a window in a pass, so the engine (not the verifier) rolls
    their K/V back when a pass is applied. ``fast_step``: the fast path, whose step in flight says whether
    deferring a pass lets anything run. ``finish``: ends a request (its K/V and its decode row freed).
    """

    def __init__(self, verifier, *, pool: RequestPool, kv, decode_state: DecodeState, fast_step,
                 config: EngineConfig, canonical_config: CanonicalConfig, is_drafting_ahead: bool,
                 finish: Callable[[Request], None]):
        self.verifier = verifier
        self.pool = pool
        self.kv = kv
        self.decode_state = decode_state
        self.fast_step = fast_step
        self.config = config
        self.canonical_config = canonical_config
        self.is_drafting_ahead = is_drafting_ahead
        self._finish = finish
        self.stats = pool.stats
        self.oldest: LaunchedPass | None = None  # the oldest pass in flight
        self.chained: LaunchedPass | None = None  # a pass launched behind it without waiting
        # the pass buckets a green context confines (``canonical_sms``; none on the CPU): counted in confined_passes
        self._confined_buckets = frozenset(getattr(getattr(verifier, "canonical_pass", None), "confined_buckets", ()))
        # whether the verifier can chain passes at all; the scheduler then sees prompts whose chunk is in a pass
        pool.chain_prefill = bool(getattr(verifier, "chains", False)) and config.chain_passes != "off"

    @property
    def num_in_flight(self) -> int:
        return (self.oldest is not None) + (self.chained is not None)

    # -- the top of a step ------------------------------------------------------------------------
    def advance(self) -> None:
        """A sliced pass's next slice (``canonical_slices``): one a step."""
        advance = getattr(self.oldest, "advance", None)
        if advance is not None:
            advance()

    def apply_ready(self, events: dict[int, list[int]]) -> bool:
        """Apply every pass in flight that has finished, oldest first; whether any was."""
        applied = False
        while self.oldest is not None and self.oldest.is_ready():
            self.apply_oldest(events)
            applied = True
        return applied

    def wait_briefly(self, events: dict[int, list[int]], timeout_s: float) -> None:
        """A step with nothing else to launch: wait up to ``timeout_s`` for the oldest pass and apply it if it
        finished (bounded, so a caller's loop still takes new requests meanwhile: a free one may run beside it)."""
        if self.oldest is not None and _wait_ready(self.oldest, timeout_s):
            self.apply_oldest(events)

    def drain(self, events: dict[int, list[int]]) -> None:
        """Apply every pass in flight (waiting for each)."""
        while self.oldest is not None:
            self.apply_oldest(events)

    # -- a step's canonical phase -----------------------------------------------------------------
    def run(self, plan: Plan, windows: dict[int, int], events: dict[int, list[int]], *, applied: bool) -> None:
        """The plan's canonical pass: launched (chained behind the pass in flight, or after it is applied),
        deferred while one runs, or left to the next step (``split_pass_steps``); ``applied``: whether this step
        applied a pass already."""
        if applied and self._splits_pass_steps():
            return
        in_flight = self.oldest
        if in_flight is not None and self.pool.chain_prefill and not in_flight.is_ready():
            # behind the pass in flight (at most two in flight): the plan's windows belong to requests in no
            # pass (the scheduler sees no other), its prompt chunks to new prompts or follow chunks in flight
            is_next_chunks = not plan.verify and all(self.pool.running[c.rid].is_verifying
                                                     for c in plan.canonical_prefill)
            if self.chained is None and (is_next_chunks or self.config.chain_passes == "all"):
                self.chained = self.launch(plan, windows, events)
                return
            if is_next_chunks:  # a long prompt's next chunk: the oldest applied, the chained one is the oldest
                self.apply_oldest(events)
                self.chained = self.launch(plan, windows, events)
                return
        if (in_flight is not None and self.is_drafting_ahead and self.fast_step.in_flight is not None
                and not in_flight.is_ready()):
            # the pass in flight (or two, one chained behind the other) still running: the loop does not wait
            # for it: this step's windows and prompt chunks go to a later pass, their requests draft ahead
            self.stats["deferred_passes"] += 1
            return
        while self.oldest is not None:  # windows wait for what the passes in flight commit
            self.apply_oldest(events)
            applied = True
        if applied and self._splits_pass_steps():
            return
        self.oldest = self.launch(plan, windows, events)
        # applied now when it has already finished (always on the CPU without canonical_thread), else later
        if self.oldest is not None and (not self.config.overlap or self.oldest.is_ready()):
            self.apply_oldest(events)

    def _splits_pass_steps(self) -> bool:
        """With ``split_pass_steps``, in a step that applied a pass: whether the pass it planned waits for the next
        step (its requests can draft ahead meanwhile: a fast step is in flight); counted in ``split_passes``."""
        if not (self.config.split_pass_steps and self.is_drafting_ahead and self.fast_step.in_flight is not None):
            return False
        self.stats["split_passes"] += 1
        return True

    def launch(self, plan: Plan, windows: dict[int, int], events: dict[int, list[int]]) -> LaunchedPass | None:
        """Launch the plan's canonical pass; returns it in flight (None: a synchronous verifier, applied here).

        ``windows``: each verify request's candidates as the scheduler saw them: a window holds no more,
        whatever was read back since."""
        running = self.pool.running
        work: list[CanonicalWork] = []
        for chunk in plan.canonical_prefill:
            req = running[chunk.rid]
            start = req.prefill_frontier
            seg = Segment(req.rid, tuple(req.prompt[start: start + chunk.num_tokens]), start, req.params, req.seed)
            work.append(CanonicalWork(seg, is_prefill=True, is_last_chunk=seg.end == len(req.prompt)))
        for rid in plan.verify:
            req = running[rid]
            start = req.num_committed - 1
            req.num_in_pass = min(len(req.candidates), req.window_depth(self.canonical_config.window), windows[rid])
            window = (req.committed_token(start), *req.candidates[: req.num_in_pass])
            work.append(CanonicalWork(Segment(req.rid, window, start, req.params, req.seed), is_prefill=False))
        launch = getattr(self.verifier, "launch", None)
        num_rows = self.canonical_config.num_rows
        launched = None
        if launch is None:  # a user's verifier with verify() only: synchronous
            self._apply_commits(self.verifier.verify(work, self.kv), events)
        else:
            launched = launch(work, self.kv)
            num_rows = getattr(launched.result, "num_rows", None) or num_rows
            for w in work:
                req = running[w.segment.rid]
                req.num_passes += 1
                if w.is_prefill:
                    req.num_prefill_launched = w.segment.end
                else:  # its window's positions are the pass's to write, even with drafts ahead
                    self.decode_state.set_protect(req.slot, w.segment.end)
        self.stats["canonical_passes"] += 1
        self.stats["prompt_passes"] += bool(plan.canonical_prefill)
        self.stats["confined_passes"] += launched is not None and num_rows in self._confined_buckets
        self.stats["canonical_rows"] += num_rows
        self.stats["canonical_rows_used"] += sum(len(w.segment.tokens) for w in work)
        return launched

    def apply_oldest(self, events: dict[int, list[int]]) -> None:
        """Apply the oldest pass in flight (waiting for it); a pass chained behind it becomes the oldest."""
        launched, self.oldest = self.oldest, self.chained
        self.chained = None
        running = self.pool.running
        try:
            commits = (self.verifier.finish(launched, self.kv, truncate=False) if self.is_drafting_ahead
                       else self.verifier.finish(launched, self.kv))
        except BaseException:
            self._drop_chained(launched)
            raise
        finally:
            for w in launched.work:
                running[w.segment.rid].num_passes -= 1
        self._apply_commits(commits, events, truncate=self.is_drafting_ahead)

    def _drop_chained(self, failed: LaunchedPass) -> None:
        """A pass failed: its prompt chunks are launched again from their requests' committed prefill, and a pass
        chained behind it (which read their K/V) is waited for and dropped the same way, nothing of it applied."""
        chained, dropped = self.oldest, [failed]
        if chained is not None and chained is not failed:
            self.oldest = None
            dropped.append(chained)
            try:
                chained.result.wait()  # it writes K/V: let it land before anything reuses the blocks
            except Exception:  # noqa: BLE001 - dropped either way; the first pass's error is the one raised
                pass
            for w in chained.work:
                self.pool.running[w.segment.rid].num_passes -= 1
        for launched in dropped:
            for w in launched.work:
                req = self.pool.running[w.segment.rid]
                req.num_prefill_launched = req.num_prefilled

    def _apply_commits(self, commits: list[Commit], events: dict[int, list[int]], *,
                       truncate: bool = False) -> None:
        """``truncate``: the engine rolls each request's K/V back (the verifier left it: drafts ahead)."""
        state = self.decode_state
        for commit in commits:
            req = self.pool.running[commit.rid]
            is_finished, keeps = self.pool.apply_commit(req, commit, self.kv, events, truncate=truncate)
            state.sync_table(req.slot, req.rid)  # the pass appended blocks, the rollback may have dropped some
            if is_finished:
                self._finish(req)
                continue
            state.set_protect(req.slot, commit.num_kv_valid)  # canonical K/V now: no decode step writes there
            if commit.token_ids and not keeps:  # else the device already feeds the drafts ahead
                state.set_next(req.slot, req.token_ids[-1], req.num_committed - 1)


__all__ = ["CanonicalPasses"]
