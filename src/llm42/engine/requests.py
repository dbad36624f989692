"""Request bookkeeping: one ``Request`` per submitted prompt, and the pool that admits, commits and finishes them.

Stops are decided on committed tokens only. A request's fast-path tokens may be
*in flight* (launched on the device, not yet read back: ``num_pending``); the
pool counts them as generated or as candidates when it tells the scheduler what
a request may do next, so the one-step lag of the overlapped loop never lets a
request run past its reservation.
"""

from __future__ import annotations

import bisect
import warnings
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from llm42.params import Completion, SamplingParams
from llm42.scheduler import PrefillChunk, RequestView
from llm42.verify.windows import Commit

STAT_NAMES = (
    "steps", "fast_steps", "mixed_steps", "mixed_dropped", "filtered_steps", "fast_tokens", "canonical_passes",
    "prompt_passes", "confined_passes",
    "canonical_rows", "canonical_rows_used",
    "committed_tokens", "accepted_tokens", "rollbacks", "recomputed_tokens", "prefix_cached_tokens",
    "score_passes", "scored_tokens", "ahead_tokens_kept", "ahead_tokens_dropped",
    "deferred_passes", "split_passes", "risky_drafts", "risky_rollbacks", "prompt_draft_tokens", "admitted_by_wait",
)
# Draft margins (``llm42.sampler.sample_with_margins``, in logits) are counted per bucket when a canonical pass
# verifies them: ``verified_margin_<edge>`` (drafts under that edge and at or over the one before; ``_inf`` the
# rest) and ``rejected_margin_<edge>`` (the rejected draft of a rollback). Their ratio per bucket is the rate at
# which drafts of that margin flip: what ``risk_margin`` is calibrated from.
MARGIN_EDGES = (0.03125, 0.0625, 0.125, 0.25, 0.5, 1.0, 2.0, float("inf"))
_MARGIN_KEYS = tuple(f"_margin_{'inf' if edge == float('inf') else format(edge, 'g')}" for edge in MARGIN_EDGES)
MARGIN_STATS = tuple(kind + key for kind in ("verified", "rejected") for key in _MARGIN_KEYS)
_VERIFIED_KEYS = tuple("verified" + key for key in _MARGIN_KEYS)
_REJECTED_KEYS = tuple("rejected" + key for key in _MARGIN_KEYS)
_FINITE_EDGES = MARGIN_EDGES[:-1]  # bisect_right on these: the bucket's index, inf (and NaN) in the last


@dataclass
class Request:
    rid: int
    prompt: list[int]
    params: SamplingParams
    seed: int
    stop_ids: frozenset[int]
    arrival: int | None = None  # admission order; None while waiting
    submitted_step: int = 0  # the engine step at which it was queued (``RequestPool.enqueue``)
    slot: int | None = None  # row of the device-resident decode state; None while waiting
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[dict[int, float]] = field(default_factory=list)  # with logprobs=N only
    candidates: list[int] = field(default_factory=list)
    candidate_margins: list[float] = field(default_factory=list)  # each candidate's draft margin
    risky: list[int] = field(default_factory=list)  # indices of candidates with a margin under risk_margin
    risk_margin: float = 0.0  # a draft with a smaller margin closes its window (0: never); set on admission
    num_pending: int = 0  # fast-path tokens launched but not yet read back
    num_discard: int = 0  # of those, how many a rollback made void: dropped when read back
    num_passes: int = 0  # canonical passes in flight that hold rows of this request (at most two: chained chunks)
    num_in_pass: int = 0  # while verifying: the leading candidates in the pass's window (the rest are ahead)
    # the token a pass committed after a whole window, which the first live fast token in flight (the draft
    # ahead at that position) must equal for the drafts after it to stand; None: no such check pending
    ahead_check: int | None = None
    num_prefilled: int = 0
    # the end of the prompt positions handed to canonical passes (committed or in flight); the next chunk of a
    # deterministic prompt starts here. Only a chained pass launches a chunk before the one before it commits
    num_prefill_launched: int = 0
    # ``prompt_drafts``: the end of the prompt positions the fast path has run (its K/V written where no canonical
    # pass had them) for a deterministic request to draft from before its prompt's passes commit
    num_fast_prompt: int = 0
    num_rollbacks: int = 0
    num_recomputed: int = 0
    finish_reason: str | None = None
    draft_limit: int | None = None  # adaptive speculation depth; None = the full window
    # copies of fixed facts, read on the hot path (set from prompt and params)
    is_deterministic: bool = field(init=False)
    num_prompt_tokens: int = field(init=False)
    max_new_tokens: int = field(init=False)
    # a free request whose fast tokens need processed log-probs or top-N alternatives (the fast step computes them)
    wants_fast_details: bool = field(init=False)

    def __post_init__(self) -> None:
        params = self.params
        self.is_deterministic = params.deterministic
        self.num_prompt_tokens = len(self.prompt)
        self.max_new_tokens = params.max_new_tokens
        self.wants_fast_details = not params.deterministic and (params.is_processed_logprobs
                                                                 or params.num_top_logprobs > 0)

    @property
    def is_prefill(self) -> bool:
        return self.num_prefilled < self.num_prompt_tokens

    @property
    def is_verifying(self) -> bool:
        """Whether a canonical pass that has not been applied yet holds rows of this request."""
        return self.num_passes > 0

    @property
    def prefill_frontier(self) -> int:
        """Where this request's next prompt chunk starts: past the committed chunks and any in flight."""
        return max(self.num_prefilled, self.num_prefill_launched)

    def is_chainable(self) -> bool:
        """In flight with prompt chunks only, more of the prompt to go: its next chunk may go in a pass chained
        behind (the chunk's K/V reads wait for the earlier chunks' writes on the device, not on the host)."""
        return self.is_deterministic and self.is_verifying and self.prefill_frontier < self.num_prompt_tokens

    @property
    def num_committed(self) -> int:
        """Prompt plus committed output tokens."""
        return self.num_prompt_tokens + len(self.token_ids)

    @property
    def max_tokens(self) -> int:
        return self.num_prompt_tokens + self.max_new_tokens

    @property
    def num_live_pending(self) -> int:
        """In-flight fast tokens that are (or will be) candidates: not voided by a rollback, not the draft
        that ``ahead_check`` compares with a committed token."""
        return self.num_pending - self.num_discard - (self.ahead_check is not None)

    @property
    def num_candidates(self) -> int:
        """Candidates read back plus those in flight (deterministic requests only)."""
        return len(self.candidates) + (self.num_live_pending if self.is_deterministic else 0)

    @property
    def num_generated(self) -> int:
        """Committed output tokens plus, for a free request, those in flight."""
        return len(self.token_ids) + (0 if self.is_deterministic else self.num_pending)

    @property
    def next_position(self) -> int:
        """Position of the token the next fast decode step feeds in (every in-flight token counts)."""
        return self.num_prompt_tokens + len(self.token_ids) + len(self.candidates) + self.num_live_pending - 1

    @property
    def is_schedulable(self) -> bool:
        """Not waiting on the device: no canonical pass in flight, not about to hit its length limit."""
        return not self.is_verifying and self.num_generated < self.max_new_tokens

    def committed_token(self, position: int) -> int:
        return self.prompt[position] if position < len(self.prompt) else self.token_ids[position - len(self.prompt)]

    def add_candidate(self, token: int, margin: float) -> bool:
        """A draft read back, with its margin; True if it is risky (margin under ``risk_margin``: it ends its
        window)."""
        is_risky = margin < self.risk_margin
        if is_risky:
            self.risky.append(len(self.candidates))
        self.candidates.append(token)
        self.candidate_margins.append(margin)
        return is_risky

    def drop_leading_candidates(self, num: int) -> None:
        """Forget the first ``num`` candidates (a pass committed their positions)."""
        del self.candidates[:num], self.candidate_margins[:num]
        if self.risky:
            self.risky = [i - num for i in self.risky if i >= num]

    def clear_candidates(self) -> None:
        self.candidates.clear()
        self.candidate_margins.clear()
        self.risky.clear()

    def _full_depth(self, window: int) -> int:
        return window - 1 if self.draft_limit is None else min(window - 1, self.draft_limit)

    def _depth_from(self, window: int, start: int) -> int:
        """The depth of the window whose first candidate is ``start``: the full depth, or up to and including
        its first risky candidate."""
        depth = self._full_depth(window)
        for i in self.risky:
            if i >= start:
                return min(depth, i - start + 1)
        return depth

    def window_depth(self, window: int) -> int:
        """The most candidates the next verify window of this request holds (cut at a risky draft)."""
        return self._depth_from(window, 0)

    def num_speculable(self, window: int) -> int:
        """Further candidates the scheduler may have the fast path draft before the window is due."""
        if not self.is_deterministic:
            return 0
        if self.candidates and self.num_live_pending == 0 and self.candidates[-1] in self.stop_ids:
            return 0
        remaining = self.max_new_tokens - len(self.token_ids)
        # a risky draft ends the window but makes it due only if the scheduler says so (RequestView.is_risky)
        return max(0, min(self._full_depth(window), remaining - 1) - self.num_candidates)

    def num_draftable_ahead(self, window: int, *, joins_pass: bool = False) -> int:
        """Candidates the engine may still draft *ahead* of a window that is due or in a canonical pass, or of a
        prompt whose canonical prefill is pending once the fast path has run it (``prompt_drafts``).

        Up to a next window's worth plus one: the fast path's guess at the token the pass commits after a
        fully accepted window (the drafts after it stand only if the pass commits that very token).
        ``joins_pass``: the window goes into the pass this step launches (the plan's ``verify``), partial or not:
        every candidate drafted so far is in it (a partial window then drafts ahead as a due one does, instead of
        losing the step's row; if the pass is deferred the draft is one more candidate of the window).
        """
        if not self.is_deterministic:
            return 0
        if self.is_prefill:
            if self.num_fast_prompt < self.num_prompt_tokens:
                return 0
            # drafting from the fast path's prompt (``prompt_drafts``): the first draft guesses the token the pass of
            # the prompt's last chunk commits, the ones after it are a next window's worth
            in_window = 0
        elif self.is_verifying:
            in_window = self.num_in_pass
        elif joins_pass:
            in_window = min(self.num_candidates, self.window_depth(window))
        else:
            in_window = self.window_depth(window)
            if self.num_candidates < in_window:
                return 0  # not due: the scheduler's to draft
        if self.candidates and self.num_live_pending == 0 and self.candidates[-1] in self.stop_ids:
            return 0
        remaining = self.max_new_tokens - len(self.token_ids)
        # a next window's worth, risky drafts or not: a risky draft ends the window it falls in, it never stops
        # the drafting (its pass may accept it)
        depth = self._full_depth(window)
        return max(0, min(in_window + depth + 1, remaining - 1) - self.num_candidates)

    def view(self, window: int) -> RequestView:
        """What the scheduler sees of this request. Built for every running request every step, so the properties
        it reads (``window_depth``, ``num_candidates``, ``num_speculable``, ``prefill_frontier``) are inlined here;
        ``tests/test_request_views.py`` checks it against them."""
        num_committed = len(self.token_ids)
        if not self.is_deterministic:
            return RequestView(self.rid, False, self.num_prompt_tokens, self.num_prefilled,
                               num_committed + self.num_pending, 0, 0, self.arrival, False, self.max_new_tokens)
        # candidates drafted ahead of a due window are not the scheduler's to count
        full = window - 1 if self.draft_limit is None or self.draft_limit > window - 1 else self.draft_limit
        risky = self.risky  # ascending candidate indices: the first one ends the window
        depth = full if not risky or risky[0] + 1 >= full else risky[0] + 1
        live = self.num_pending - self.num_discard - (self.ahead_check is not None)
        candidates = self.candidates
        num_candidates = len(candidates) + live
        if candidates and live == 0 and candidates[-1] in self.stop_ids:
            speculable = 0
        else:
            left = self.max_new_tokens - num_committed - 1
            speculable = max(0, (full if full < left else left) - num_candidates)
        frontier = self.num_prefilled if self.num_prefilled > self.num_prefill_launched else self.num_prefill_launched
        return RequestView(self.rid, True, self.num_prompt_tokens, frontier, num_committed,
                           num_candidates if num_candidates < depth else depth, speculable, self.arrival,
                           bool(risky) and risky[0] < depth, self.max_new_tokens)

    def adapt_draft_limit(self, commit: Commit, window: int) -> None:
        """Halve the speculation depth after a rollback, double it after a full window is accepted.

        Only when a request drafts and verifies happens changes: the committed tokens do not
        (the contract holds for any verification schedule).
        """
        limit = window - 1 if self.draft_limit is None else self.draft_limit
        if commit.num_rejected:
            self.draft_limit = max(1, limit // 2)
        elif commit.num_accepted >= limit:
            self.draft_limit = min(window - 1, max(1, limit) * 2)

    def completion(self, text: str | None) -> Completion:
        num_top = self.params.num_top_logprobs
        return Completion(
            request_id=self.rid, prompt_token_ids=list(self.prompt), token_ids=list(self.token_ids), text=text,
            finish_reason=self.finish_reason, logprobs=list(self.logprobs) if self.params.wants_logprobs else None,
            num_rollbacks=self.num_rollbacks, num_recomputed=self.num_recomputed,
            top_logprobs=[dict(list(top.items())[:num_top]) for top in self.top_logprobs] if num_top else None,
        )


def _larger_budget_first(req: Request) -> int:
    return -req.max_new_tokens


class RequestPool:
    """Waiting and running requests, finished Completions, and the engine's counters.

    Paired verbs for the request life cycle: ``enqueue`` -> ``admit`` -> (``apply_fast`` /
    ``apply_commit``) -> ``finish`` (or ``abort_waiting`` before admission). The pool owns no tensors: K/V accounting goes through the
    store passed in, device state through the caller.
    """

    def __init__(self, *, max_num_seqs: int, window: int, adaptive_draft: bool, risk_margin: float = 0.0,
                 admission: str = "arrival", max_wait_steps: int | None = None):
        self.max_num_seqs = max_num_seqs
        # the waiting queue's order: "arrival" (oldest first) or "budget" (the largest max_new_tokens first, oldest
        # among equals), kept as requests are enqueued
        self.admission = admission
        # with "budget": a request queued this many engine steps or more goes next, oldest first (None: no bound);
        # the queue in submission order beside the budget-ordered one, left lazily as requests leave the queue
        self.max_wait_steps = max_wait_steps
        self._by_submission: deque[Request] | None = (
            deque() if admission == "budget" and max_wait_steps is not None else None)
        self.window = window
        self.adaptive_draft = adaptive_draft
        self.risk_margin = risk_margin
        self.waiting: deque[Request] = deque()
        self.running: dict[int, Request] = {}
        self.finished: dict[int, Completion] = {}  # until handed over (result, abort, generate, stream)
        self.unfreed: set[int] = set()  # finished requests whose kv.free raised
        self.stats: dict[str, int] = dict.fromkeys(STAT_NAMES + MARGIN_STATS, 0)
        self._num_arrivals = 0
        self._free_slots = list(range(max_num_seqs - 1, -1, -1))
        # whether the scheduler sees a deterministic prompt whose chunk is in a pass (``is_chainable``): the
        # engine sets it where its verifier chains passes (CUDA: each pass's staging waits on the device)
        self.chain_prefill = False

    def enqueue(self, req: Request, step: int = 0) -> None:
        """Queue ``req`` for admission at engine step ``step`` (its wait counts from there)."""
        req.submitted_step = step
        if self.admission == "budget":  # after every request with at least its budget: oldest first among equals
            bisect.insort_right(self.waiting, req, key=_larger_budget_first)
            if self._by_submission is not None:
                self._by_submission.append(req)
        else:
            self.waiting.append(req)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def state_of(self, rid: int) -> str:
        """'finished', 'running', 'waiting' or 'unknown'."""
        if rid in self.finished:
            return "finished"
        if rid in self.running:
            return "running"
        if any(r.rid == rid for r in self.waiting):
            return "waiting"
        return "unknown"

    def admit(self, kv, step: int = 0) -> list[Request]:
        """Admit waiting requests from the front of the queue (in ``admission`` order) while seats and K/V
        reservations allow, at engine step ``step``. The first request that does not fit stops admission, so no
        request behind it goes first and it waits only for running requests to finish. With ``max_wait_steps``,
        the front is the oldest request queued that many steps ago or more, where there is one."""
        admitted = []
        while self.waiting and len(self.running) < self.max_num_seqs:
            req = self._front(step)
            # reuse canonical K/V of a cached prefix; the last prompt token is always computed,
            # since its row yields the first output token
            prefix = kv.match_prefix(req.prompt[:-1])
            if not kv.can_allocate(req.max_tokens, prefix):
                break
            if req is self.waiting[0]:
                self.waiting.popleft()
            else:  # a request that waited max_wait_steps: out of the middle of the budget order (by identity)
                del self.waiting[next(i for i, r in enumerate(self.waiting) if r is req)]
                self.stats["admitted_by_wait"] += 1
            kv.allocate(req.rid, req.max_tokens, prefix)
            req.num_prefilled = req.num_fast_prompt = len(prefix) * kv.block_size
            self.stats["prefix_cached_tokens"] += req.num_prefilled
            req.arrival = self._num_arrivals
            self._num_arrivals += 1
            req.slot = self._free_slots.pop()
            req.risk_margin = self.risk_margin
            self.running[req.rid] = req
            admitted.append(req)
        return admitted

    def _front(self, step: int) -> Request:
        """The request to admit next: the queue's first, or with ``max_wait_steps`` the oldest request queued at
        least that many steps before ``step`` (those that left the queue are dropped from the front lazily)."""
        oldest = self._by_submission
        if oldest is not None:
            while oldest and (oldest[0].arrival is not None or oldest[0].finish_reason is not None):
                oldest.popleft()  # admitted, or aborted while waiting
            if oldest and step - oldest[0].submitted_step >= self.max_wait_steps:
                return oldest[0]
        return self.waiting[0]

    def views(self) -> tuple[RequestView, ...]:
        """What the scheduler may see: schedulable running requests, oldest first (dicts keep admission order):
        those in no pass in flight (or, where passes chain, whose next prompt chunk may follow one) that may still
        generate (``num_generated`` inlined: a free request's in-flight tokens count)."""
        window = self.window
        chain = self.chain_prefill
        views = []
        add = views.append
        for r in self.running.values():
            if not r.is_deterministic:  # ``Request.view`` of a free request, written out (never chainable)
                generated = len(r.token_ids) + r.num_pending
                if r.num_passes == 0 and generated < r.max_new_tokens:
                    add(RequestView(r.rid, False, r.num_prompt_tokens, r.num_prefilled, generated, 0, 0, r.arrival,
                                    False, r.max_new_tokens))
            elif (r.num_passes == 0 or (chain and r.is_chainable())) and len(r.token_ids) < r.max_new_tokens:
                add(r.view(window))
        return tuple(views)

    def apply_fast(self, req: Request, token: int, value: float, events: dict[int, list[int]],
                   top_logprobs: dict[int, float] | None = None) -> bool:
        """One fast-path token read back: a candidate (deterministic) or committed (free). True if it finished.

        ``value``: a free request's log-prob, a deterministic request's draft margin
        (``DecodeState.draft_values``)."""
        if req.is_deterministic:
            self.stats["fast_tokens"] += 1
            if req.add_candidate(token, value):
                self.stats["risky_drafts"] += 1
            return False
        if top_logprobs is not None:
            req.top_logprobs.append(top_logprobs)
        return self.apply_free_token(req, token, value, events)

    def apply_free_token(self, req: Request, token: int, logprob: float, events: dict[int, list[int]]) -> bool:
        """``apply_fast`` of a free request's token without top-N alternatives (the common row, written out: every
        step reads one per running free request). True if it finished."""
        stats = self.stats
        stats["fast_tokens"] += 1
        stats["committed_tokens"] += 1
        req.token_ids.append(token)
        req.logprobs.append(logprob)
        tokens = events.get(req.rid)
        if tokens is None:
            events[req.rid] = [token]
        else:
            tokens.append(token)
        if token in req.stop_ids:
            req.finish_reason = "stop"
            return True
        if len(req.token_ids) >= req.max_new_tokens:
            req.finish_reason = "length"
            return True
        return False

    def apply_commit(self, req: Request, commit: Commit, kv, events: dict[int, list[int]], *,
                     truncate: bool = False) -> tuple[bool, bool]:
        """A canonical pass's outcome for ``req``: (whether it finished, whether its drafts ahead stand).

        Candidates the fast path drafted ahead of the window while the pass ran stand if the window was
        accepted whole and the first of them is the very token the pass committed after it; otherwise
        they are dropped, with any still in flight (``num_discard``). ``truncate``: roll the K/V back to
        the committed prefix here unless the drafts ahead stand (a verifier that kept the drafts' K/V);
        else the verifier has done so.
        """
        keeps = False
        has_prompt_drafts = False
        if commit.is_prefill:
            req.num_prefilled = commit.num_kv_valid
            # the prompt's last chunk with drafts from the fast path's prompt (``prompt_drafts``): its first draft
            # guessed the committed token
            has_prompt_drafts = bool(commit.token_ids) and bool(req.candidates or req.num_live_pending)
            if has_prompt_drafts:
                keeps = self._keep_ahead(req, 0, commit.token_ids[-1])
        else:
            stats = self.stats
            stats["accepted_tokens"] += commit.num_accepted
            self._count_margins(req, commit)
            if commit.num_rejected:
                req.num_rollbacks += 1
                req.num_recomputed += commit.num_rejected
                stats["rollbacks"] += 1
                stats["recomputed_tokens"] += commit.num_rejected
            if not commit.num_rejected and (len(req.candidates) > req.num_in_pass or req.num_live_pending):
                keeps = self._keep_ahead(req, req.num_in_pass, commit.token_ids[-1])
            else:
                self.drop_drafts(req, max(0, len(req.candidates) - req.num_in_pass))
            if self.adaptive_draft:
                req.adapt_draft_limit(commit, self.window)
        req.num_in_pass = 0
        # a chunk's K/V stands (a chained chunk's past it); a last chunk's drafts that fell leave theirs past it
        if truncate and not keeps and (not commit.is_prefill or has_prompt_drafts):
            kv.truncate(req.rid, commit.num_kv_valid)
        # index the now-canonical full blocks before the request may finish and release them
        kv.publish(req.rid, _Joined(req.prompt, req.token_ids, commit.token_ids))
        if commit.token_ids:
            return self.commit_tokens(req, list(commit.token_ids), list(commit.logprobs), events,
                                      list(commit.top_logprobs)), keeps
        return False, keeps

    def _keep_ahead(self, req: Request, num_in_pass: int, token: int) -> bool:
        """Whether the drafts after ``req``'s first ``num_in_pass`` candidates (the window a pass accepted whole, or
        none: a prompt's last chunk) stand: the first of them, at the committed ``token``'s position, must be that
        token. Read back: compared now (the drafts fall, or stand less that one); in flight: ``check_ahead``
        compares it when it is read back."""
        ahead = req.candidates[num_in_pass:]  # drafted while the pass ran
        if ahead:
            keeps = ahead[0] == token
            req.drop_leading_candidates(num_in_pass + 1)
        else:
            keeps = True
            req.clear_candidates()
            req.ahead_check = token
        if keeps:
            self.stats["ahead_tokens_kept"] += len(ahead)
        else:
            self.drop_drafts(req, len(ahead))
        return keeps

    def drop_drafts(self, req: Request, num_read: int) -> None:
        """Drop ``req``'s candidates (``num_read`` of them drafted ahead of a window) and void its tokens in
        flight: a commit made them wrong."""
        self.stats["ahead_tokens_dropped"] += num_read + req.num_live_pending
        req.num_discard = req.num_pending
        req.ahead_check = None
        req.clear_candidates()

    def _count_margins(self, req: Request, commit: Commit) -> None:
        """The margin buckets of the window's verified drafts (the accepted ones and the rejected one).

        Counted per bucket first, then added: every window of every pass comes through here."""
        stats, margins = self.stats, req.candidate_margins
        num_accepted = commit.num_accepted
        num_verified = min(len(margins), num_accepted + (1 if commit.num_rejected else 0))
        if not num_verified:
            return
        counts = [0] * len(MARGIN_EDGES)
        for margin in margins[:num_verified]:  # the last edge is inf: the finite edges give the bucket
            counts[bisect.bisect_right(_FINITE_EDGES, margin)] += 1
        for key, count in zip(_VERIFIED_KEYS, counts):
            if count:
                stats[key] += count
        if num_verified > num_accepted:  # the rejected draft
            margin = margins[num_accepted]
            stats[_REJECTED_KEYS[bisect.bisect_right(_FINITE_EDGES, margin)]] += 1
            if margin < req.risk_margin:
                stats["risky_rollbacks"] += 1

    def check_ahead(self, req: Request, token: int) -> bool:
        """The draft ahead at the position of the token a pass committed, read back: True if it is that token
        (the drafts after it stand: it is dropped as a candidate only); else its drafts are dropped and the
        caller must feed the committed token again."""
        expected, req.ahead_check = req.ahead_check, None
        if token == expected:
            self.stats["ahead_tokens_kept"] += 1
            return True
        self.drop_drafts(req, 1)
        return False

    def drafting_ahead(self, exclude, max_rows: int, joining=frozenset()) -> list[int]:
        """Deterministic requests, oldest first, whose window is due, in a canonical pass or ``joining`` the pass
        this step launches, and which may draft ahead of it (at most ``max_rows``; none of ``exclude``, the step's
        own decode rows)."""
        window = self.window
        out = []
        for rid, req in self.running.items():
            if len(out) == max_rows:
                break
            if (req.is_deterministic and rid not in exclude
                    and req.num_draftable_ahead(window, joins_pass=rid in joining) > 0):
                out.append(rid)
        return out

    def prompts_to_draft(self, max_rows: int, max_chunks: int) -> list[PrefillChunk]:
        """``prompt_drafts``: chunks of deterministic prompts for the fast path, at most ``max_chunks`` of them in at
        most ``max_rows`` rows, oldest first, each from where the fast path's run of it stands. Only positions no canonical pass has (launched or
        committed: the prefill frontier not past that point), so a fast K/V write never lands where a canonical pass
        wrote or will have written first; and only for requests with more than two output tokens to draft."""
        out = []
        for req in self.running.values():
            if max_rows <= 0 or len(out) == max_chunks:
                break
            if (req.is_deterministic and req.num_fast_prompt < req.num_prompt_tokens and req.max_new_tokens > 2
                    and req.num_fast_prompt >= req.num_prefilled and req.num_fast_prompt >= req.num_prefill_launched):
                num = min(req.num_prompt_tokens - req.num_fast_prompt, max_rows)
                out.append(PrefillChunk(req.rid, num))
                max_rows -= num
        return out

    def commit_tokens(self, req: Request, tokens: list[int], logprobs: list[float],
                      events: dict[int, list[int]], top_logprobs: list[dict[int, float]] | None = None) -> bool:
        """Append committed tokens, deciding stops on committed tokens only. True if the request finished.

        The tokens up to and including the first stop token, or up to ``max_new_tokens`` (a stop token that
        is also the last one allowed finishes as "stop"); appended in one go (a window's worth per commit)."""
        num = min(len(tokens), len(logprobs))
        room = max(1, req.max_new_tokens - len(req.token_ids))  # a request still running takes at least one
        stop_at = None
        if not req.stop_ids.isdisjoint(tokens[:num]):
            stop_at = next(i for i in range(num) if tokens[i] in req.stop_ids)
        if stop_at is not None and stop_at < min(room, num):
            num, req.finish_reason = stop_at + 1, "stop"
        elif room <= num:
            num, req.finish_reason = room, "length"
        accepted = tokens[:num]
        req.token_ids += accepted
        req.logprobs += logprobs[:num]
        if top_logprobs:
            req.top_logprobs += top_logprobs[:num]
        self.stats["committed_tokens"] += num
        events.setdefault(req.rid, []).extend(accepted)
        return req.finish_reason is not None

    def finish(self, req: Request, kv, tokenizer) -> None:
        """Release ``req``'s K/V and seat and keep its Completion until it is taken.

        Nothing that fails here may lose the request: its tokens are committed already. A
        tokenizer whose ``decode`` raises gives ``text=None`` (a RuntimeWarning says why); a
        ``kv.free`` that raises leaves the request in ``unfreed``, retried by ``retry_frees``.
        """
        del self.running[req.rid]
        self._free_slots.append(req.slot)
        self.finished[req.rid] = req.completion(_decoded_text(tokenizer, req))
        self._free_kv(req.rid, kv)

    def abort_waiting(self, rid: int, tokenizer) -> None:
        """Drop a request that was never admitted (it holds no K/V); its Completion has no tokens."""
        req = next(r for r in self.waiting if r.rid == rid)
        self.waiting.remove(req)
        req.finish_reason = "abort"
        self.finished[rid] = req.completion(_decoded_text(tokenizer, req))

    def _free_kv(self, rid: int, kv) -> None:
        try:
            kv.free(rid)
        except Exception as exc:  # a broken store must not lose the Completion nor stop the others
            self.unfreed.add(rid)
            warnings.warn(f"freeing the K/V of request {rid} failed ({exc!r}); retried every step",
                          RuntimeWarning, stacklevel=3)

    def retry_frees(self, kv) -> None:
        """Free the K/V of finished requests whose ``kv.free`` raised before (quietly: it was reported)."""
        for rid in list(self.unfreed):
            try:
                kv.free(rid)
            except Exception:
                continue
            self.unfreed.discard(rid)


class _Joined(Sequence):
    """Sequences read as one, without copying them (``kv.publish`` reads only the blocks it indexes, while a
    commit's prompt + output tokens may be thousands long)."""

    __slots__ = ("_parts", "_len")

    def __init__(self, *parts: Sequence[int]):
        self._parts = parts
        self._len = sum(len(p) for p in parts)

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index):
        if isinstance(index, slice):
            start, stop, step = index.indices(self._len)
            if step != 1:
                return list(self)[index]
            out: list[int] = []
            for part in self._parts:
                n = len(part)
                if start < n and stop > 0:
                    out += part[max(start, 0): min(stop, n)]
                start, stop = start - n, stop - n
                if stop <= 0:
                    break
            return out
        if index < 0:
            index += self._len
        for part in self._parts:
            if 0 <= index < len(part):
                return part[index]
            index -= len(part)
        raise IndexError("_Joined index out of range")


def _decoded_text(tokenizer, req: Request) -> str | None:
    if tokenizer is None:
        return None
    try:
        return tokenizer.decode(req.token_ids, skip_special_tokens=True)
    except Exception as exc:  # the token ids are what the contract is about: keep them
        warnings.warn(f"decoding the tokens of request {req.rid} failed ({exc!r}); its Completion.text is None",
                      RuntimeWarning, stacklevel=4)
        return None
