"""Scheduling: which requests run in the next step, as an explicit Plan.

The engine hands the scheduler a read-only snapshot (``SchedulerState``) and
gets back a ``Plan``: a fast decode batch, prompt chunks for the fast path,
verify windows and deterministic prompt chunks for the canonical pass. A
user's scheduler implements the one-method ``Scheduler`` protocol; the engine
checks every plan (``validate_plan``) so a faulty scheduler gets a clear error
and can never break the determinism contract — which holds for *any* valid
plan, since committed tokens do not depend on when or with whom a request is
verified.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol, runtime_checkable

from llm42.engine.config import positive_int


class RequestView(NamedTuple):
    """What a scheduler may know about one admitted, unfinished request (immutable).

    A named tuple rather than a frozen dataclass: the engine builds one per running
    request per step, and a tuple is built in a quarter of the time.
    """

    rid: int
    is_deterministic: bool
    num_prompt_tokens: int
    num_prefilled: int  # prompt positions already processed
    num_generated: int  # committed output tokens
    num_candidates: int  # fast-path tokens awaiting verification (deterministic only)
    num_speculable: int  # further candidates the fast path may still draft before it must verify
    arrival: int  # admission order, smaller = older
    # its window (``num_candidates``) ends at a draft whose margin is under the engine's ``risk_margin``: the
    # draft a canonical pass is likely to reject (``DVRGenerator(risk_margin=)``); False with no such draft
    is_risky: bool = False
    max_new_tokens: int | None = None  # the request's output budget (``SamplingParams``); None: not given

    @property
    def num_budget_left(self) -> int | None:
        """Output tokens the request may still produce (``max_new_tokens`` less those generated); None: unknown."""
        return None if self.max_new_tokens is None else self.max_new_tokens - self.num_generated

    @property
    def is_prefill(self) -> bool:
        return self.num_prefilled < self.num_prompt_tokens

    @property
    def num_prompt_remaining(self) -> int:
        return self.num_prompt_tokens - self.num_prefilled

    @property
    def is_ready_to_verify(self) -> bool:
        """A deterministic decode request that cannot draft further: its window is due."""
        return self.is_deterministic and not self.is_prefill and self.num_speculable == 0


@dataclass(frozen=True)
class SchedulerState:
    """What a scheduler sees of the engine at one step (read-only; a fresh one per step).

    The row budgets a plan must respect: ``max_fast_tokens`` for the fast step,
    ``max_canonical_rows`` for the canonical pass, of which at most ``max_result_rows`` may need
    results (every verify window's rows, one row per deterministic prompt chunk): R, or with llm42's
    verifier every row of a wide pass (its head and sampler run on blocks of R result rows).
    """

    requests: tuple[RequestView, ...]  # oldest first
    window: int  # T
    group: int  # G
    max_fast_tokens: int  # token rows one fast step may process
    step: int
    # token rows one canonical pass may process (a multiple of R; None: R). A pass of more than R rows
    # holds prompt chunks beside its windows; its windows' rows plus its prompt chunks are at most R
    max_canonical_tokens: int | None = None
    # rows of one canonical pass that may need results (None: R); at most max_canonical_rows
    max_canonical_results: int | None = None
    # canonical passes launched and not yet applied (0: the canonical pass's device work has run dry)
    num_passes_in_flight: int = 0

    @property
    def num_canonical_rows(self) -> int:
        """R = window x group: the rows of a canonical pass, and the most rows its results cover."""
        return self.window * self.group

    @property
    def max_canonical_rows(self) -> int:
        """The most rows one canonical pass takes (``max_canonical_tokens``, else R)."""
        return self.num_canonical_rows if self.max_canonical_tokens is None else self.max_canonical_tokens

    @property
    def max_result_rows(self) -> int:
        """The most rows of one canonical pass that may need results (``max_canonical_results``, else R)."""
        return self.num_canonical_rows if self.max_canonical_results is None else self.max_canonical_results

    @property
    def max_windows(self) -> int:
        """The most verify windows one pass takes: G per R result rows, and at most R (a pass holds at most
        R sequences: windows and prompt chunks)."""
        return min(self.num_canonical_rows, self.group * max(1, self.max_result_rows // self.num_canonical_rows))


@dataclass(frozen=True)
class PrefillChunk:
    """The next ``num_tokens`` prompt tokens of request ``rid`` (from where its prefill stands)."""

    rid: int
    num_tokens: int


@dataclass(frozen=True)
class Plan:
    """One step's work, by request id: what the engine runs, after ``validate_plan`` accepts it.

    ``fast_decode``: requests that take one fast decode step; ``fast_prefill``: prompt chunks of
    non-deterministic requests on the fast path; ``verify``: deterministic requests whose window
    (last committed token + candidates) the canonical pass checks; ``canonical_prefill``: prompt
    chunks of deterministic requests through the canonical pass. A request appears at most once.
    """

    fast_decode: tuple[int, ...] = ()
    fast_prefill: tuple[PrefillChunk, ...] = ()
    verify: tuple[int, ...] = ()
    canonical_prefill: tuple[PrefillChunk, ...] = ()

    @property
    def is_empty(self) -> bool:
        return not (self.fast_decode or self.fast_prefill or self.verify or self.canonical_prefill)

    @property
    def has_canonical_pass(self) -> bool:
        return bool(self.verify or self.canonical_prefill)


@runtime_checkable
class Scheduler(Protocol):
    """Anything with ``schedule(state) -> Plan``: called once per engine step (docs/extending.md).

    Any valid plan keeps the determinism contract; a scheduler only moves latency and throughput.
    A scheduler may also carry ``admission`` (one of ``ADMISSIONS``; ``"arrival"`` where it has none): the order in
    which the engine admits waiting requests while seats and K/V reservations are short (``DefaultScheduler``).
    """

    def schedule(self, state: SchedulerState) -> Plan:
        """This step's plan from ``state`` (a snapshot: the scheduler holds no engine state); ``validate_plan``
        refuses one the engine cannot run (``InvalidPlanError``)."""
        ...


class InvalidPlanError(RuntimeError):
    """A scheduler returned a plan the engine cannot run."""


def canonical_rows(plan: Plan, views: dict[int, RequestView]) -> int:
    return sum(1 + views[r].num_candidates for r in plan.verify) + sum(c.num_tokens for c in plan.canonical_prefill)


def _are_decode_rows_valid(decode: tuple[int, ...], views: dict[int, RequestView]) -> bool:
    """Every fast decode row names a distinct running request in decode that may draft (if deterministic)."""
    if len(set(decode)) != len(decode):
        return False
    for rid in decode:
        v = views.get(rid)
        if v is None or v.num_prefilled < v.num_prompt_tokens or (v.is_deterministic and v.num_speculable == 0):
            return False
    return True


def validate_plan(plan: Plan, state: SchedulerState) -> None:
    """Raise InvalidPlanError unless ``plan`` is runnable on ``state``."""
    views = {v.rid: v for v in state.requests}
    seen: set[int] = set()

    def take(rid: int, where: str) -> RequestView:
        if rid not in views:
            raise InvalidPlanError(f"plan.{where} names request {rid}, which is not running")
        if rid in seen:
            raise InvalidPlanError(f"plan schedules request {rid} twice in one step")
        seen.add(rid)
        return views[rid]

    decode = plan.fast_decode
    if _are_decode_rows_valid(decode, views):  # the common case, one pass over a step's (up to 1,000s of) rows
        seen.update(decode)
    else:  # name the first offending row
        for rid in decode:
            v = take(rid, "fast_decode")
            if v.is_prefill:
                raise InvalidPlanError(f"plan.fast_decode: request {rid} is still prefilling")
            if v.is_deterministic and v.num_speculable == 0:
                raise InvalidPlanError(f"plan.fast_decode: request {rid} has a full window and must be verified")
    for chunk in plan.fast_prefill:
        v = take(chunk.rid, "fast_prefill")
        if v.is_deterministic:
            raise InvalidPlanError(f"plan.fast_prefill: request {chunk.rid} is deterministic; "
                                   "its prompt must go through the canonical pass")
        if not 1 <= chunk.num_tokens <= v.num_prompt_remaining:
            raise InvalidPlanError(f"plan.fast_prefill: chunk of {chunk.num_tokens} tokens for request "
                                   f"{chunk.rid}, which has {v.num_prompt_remaining} prompt tokens left")
    for rid in plan.verify:
        v = take(rid, "verify")
        if not v.is_deterministic or v.is_prefill:
            raise InvalidPlanError(f"plan.verify: request {rid} is not a deterministic request in decode")
    for chunk in plan.canonical_prefill:
        v = take(chunk.rid, "canonical_prefill")
        if not v.is_deterministic:
            raise InvalidPlanError(f"plan.canonical_prefill: request {chunk.rid} is not deterministic")
        if not 1 <= chunk.num_tokens <= v.num_prompt_remaining:
            raise InvalidPlanError(f"plan.canonical_prefill: chunk of {chunk.num_tokens} tokens for request "
                                   f"{chunk.rid}, which has {v.num_prompt_remaining} prompt tokens left")
    fast_rows = len(plan.fast_decode) + sum(c.num_tokens for c in plan.fast_prefill)
    if fast_rows > state.max_fast_tokens:
        raise InvalidPlanError(f"plan's fast step has {fast_rows} rows, over max_fast_tokens={state.max_fast_tokens}")
    num_seqs = len(plan.verify) + len(plan.canonical_prefill)
    if num_seqs > state.num_canonical_rows:
        raise InvalidPlanError(f"plan's canonical pass holds {num_seqs} sequences (windows and prompt chunks), "
                               f"over R = {state.num_canonical_rows}")
    rows = canonical_rows(plan, views)
    if rows > state.max_canonical_rows:
        raise InvalidPlanError(f"plan's canonical pass needs {rows} rows, over R = {state.num_canonical_rows}"
                               if state.max_canonical_rows == state.num_canonical_rows else
                               f"plan's canonical pass needs {rows} rows, over max_canonical_tokens = "
                               f"{state.max_canonical_rows}")
    if rows > state.num_canonical_rows:
        results = sum(1 + views[r].num_candidates for r in plan.verify) + len(plan.canonical_prefill)
        if results > state.max_result_rows:
            bound = (f"R = {state.num_canonical_rows}" if state.max_result_rows == state.num_canonical_rows
                     else f"the {state.max_result_rows} result rows of a pass")
            raise InvalidPlanError(
                f"plan's canonical pass of {rows} rows needs results for {results} rows (its windows' rows and "
                f"one per prompt chunk), over {bound}")


def fast_prefill_chunks(state: SchedulerState, budget: int, *, order: str = "arrival") -> list[PrefillChunk]:
    """Prompt chunks of non-deterministic requests, filling at most ``budget`` fast-step rows: oldest first (also
    with ``order="canonical_budget"``, whose fast-step rows go by arrival), or with ``order="budget"`` the largest
    output budget left first (``in_order``).

    A building block for schedulers: deterministic prompts never go here (they
    are prefilled by the canonical pass).
    """
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    views = in_order(state.requests, "budget" if order == "budget" else "arrival")
    return _prompt_chunks([v for v in views if v.is_prefill and not v.is_deterministic], budget)


def _prompt_chunks(views: Sequence[RequestView], budget: int) -> list[PrefillChunk]:
    """Chunks of ``views``' prompts (free requests in prefill, in order of service) in at most ``budget`` rows."""
    chunks = []
    for v in views:
        if budget <= 0:
            break
        n = min(v.num_prompt_remaining, budget)
        chunks.append(PrefillChunk(v.rid, n))
        budget -= n
    return chunks


RISKY_WINDOWS = ("ride", "due", "off")
ORDERS = ("arrival", "budget", "canonical_budget")
# round 44: the canonical pass's rows by budget, the fast step's by arrival (SmolLM2 on an H100, offline dvr@50 0.852
# of nondet against 0.757 by arrival in one process, nondet served as by arrival; docs/benchmarks.md, "Round 44")
DEFAULT_ORDER = "canonical_budget"
VIEW_ORDERS = ("arrival", "budget")  # ``in_order``'s: a list of views in one order
ADMISSIONS = ("arrival", "budget")


def in_order(views: Sequence[RequestView], order: str) -> Sequence[RequestView]:
    """``views`` in a scheduler's order of service: ``"arrival"`` as given (oldest first); ``"budget"`` the largest
    output budget left first (``RequestView.num_budget_left``; a view without one last), oldest first among equals.

    ``"budget"`` is longest-output-first: a request that may still produce many tokens starts (or is verified)
    before one that may produce few, so a run's longest requests are not the last to begin; with every budget
    equal it is the arrival order.
    """
    if order == "arrival":
        return views
    if order != "budget":
        raise ValueError(f"order must be one of {VIEW_ORDERS}, got {order!r}")
    return sorted(views, key=_budget_key)


def _budget_key(v: RequestView) -> tuple[bool, int, int]:
    # num_budget_left inlined (no property calls): the key runs once per running request, every step
    budget = v.max_new_tokens
    return budget is None, 0 if budget is None else v.num_generated - budget, v.arrival


class DefaultScheduler:
    """Continuous batching that never makes a non-deterministic request wait for verification.

    Each step: every decode request that may draft takes a fast decode step;
    prompts of non-deterministic requests are chunked into the fast step's
    spare rows; a canonical pass is formed when a deterministic request has a
    full window (or its prompt is pending), and its rows are filled — due
    windows first, then partial windows of other deterministic requests (up
    to ``max_windows`` windows in ``max_result_rows`` rows: G windows in R
    rows, or G per R rows of a wide pass), then deterministic prompt chunks, up
    to ``max_canonical_tokens`` rows in all (one result row per chunk).

    ``prompt_share``: while deterministic prompts wait for the canonical pass, the share of each pass's
    rows that windows leave to them (at most the rows those prompts still need); 0 (the default) gives
    windows every row they can use. It helps where pass rows are the limit (tests/test_prompt_share.py);
    on the H200 serving benchmark it changed nothing, since there the passes' rate is the limit
    (docs/benchmarks.md, round 12).

    ``eager_verify``: when no canonical pass is in flight and every deterministic request drafting a window
    fits one pass of R rows (at most G of them: the tail of a run, or light deterministic traffic), verify
    their partial windows now instead of waiting for a full one. A rollback then throws away the few tokens
    drafted since the last pass rather than up to a window's worth; the pass it costs runs where the canonical
    stream would idle. Scheduling never changes a committed bit.

    ``risky_windows``: what a window that ends at a risky draft (``RequestView.is_risky``: the engine's
    ``risk_margin``) does. ``"ride"`` (default): it never forms a pass of its own, but joins the next pass formed
    for other windows or prompts, ahead of other partial windows and in any of the pass's window rows (not only
    the rows its due windows leave free). ``"due"``: it is due, as a full window is (a pass forms for it).
    ``"off"``: it is a partial window like any other.

    ``order``: the order in which requests are served wherever rows are short (prompt chunks of both kinds, due
    and partial windows, decode rows past ``max_fast_tokens``): ``"arrival"`` oldest first; ``"budget"`` the
    largest output budget left first (``in_order``: longest-output-first, as SGLang's ``lof`` policy orders by
    ``max_new_tokens``), so that a deterministic request that may produce many tokens gets its prompt's pass, and
    its windows verified, before those that may produce few; ``"canonical_budget"`` (default since round 44) the
    budget order for the canonical pass's rows alone (due, risky and partial windows, deterministic prompt chunks)
    and the arrival order for the fast step's (free prompt chunks, decode rows): a run without deterministic
    requests is served exactly as by ``"arrival"``, and a deterministic backlog's longest requests are not the last
    to be verified (SmolLM2, 1,000 requests offline, dvr@50: 0.85 of nondet against 0.76 by arrival, as by
    ``"budget"``). Scheduling never changes a committed bit.

    ``admission``: the order in which the engine admits waiting requests while seats (``max_num_seqs``) or K/V
    reservations are short: ``"arrival"`` (default) oldest first; ``"budget"`` the largest ``max_new_tokens``
    first (oldest among equals). Either way a request that does not fit stops admission until running requests
    free enough, so none behind it goes first. ``order="budget"`` orders only admitted requests: in round 32's runs
    the 1,024-token replies admitted last (K/V-limited) got their first token at 1-2 s, and ended the run.

    ``max_wait_steps`` (with ``admission="budget"``; None, the default: no bound): a request that has waited that
    many engine steps or more since it was submitted is admitted next, the oldest such first, ahead of larger
    budgets, so a stream of long requests cannot keep a short one queued forever (arrival order never can). It
    waits there, as the front of the queue does, only for running requests to free seats or K/V.

    ``age_bound`` (with ``order="budget"`` or ``"canonical_budget"``; None, the default: no bound): where the budget
    order applies, a request admitted at least that many admissions before the newest running one (``RequestView
    .arrival``) is served before the younger ones, the oldest such first: under sustained overload a request with
    little budget left cannot be kept behind a stream of longer ones forever (the arrival order never keeps it).
    """

    prompt_share: float = 0.0  # class defaults too: subclasses that skip __init__ keep working
    eager_verify: bool = False
    risky_windows: str = "ride"
    order: str = DEFAULT_ORDER
    admission: str = "arrival"
    max_wait_steps: int | None = None
    age_bound: int | None = None

    def __init__(self, *, prompt_share: float = 0.0, eager_verify: bool = False, risky_windows: str = "ride",
                 order: str = DEFAULT_ORDER, admission: str = "arrival", max_wait_steps: int | None = None,
                 age_bound: int | None = None):
        if isinstance(prompt_share, bool) or not isinstance(prompt_share, (int, float)) or not (
                0.0 <= prompt_share <= 1.0):
            raise ValueError(f"DefaultScheduler prompt_share must be a number in [0, 1], got {prompt_share!r}")
        if not isinstance(eager_verify, bool):
            raise TypeError(f"DefaultScheduler eager_verify must be a bool, got {type(eager_verify).__name__} "
                            f"{eager_verify!r}")
        if risky_windows not in RISKY_WINDOWS:
            raise ValueError(f"DefaultScheduler risky_windows must be one of {RISKY_WINDOWS}, got {risky_windows!r}")
        if order not in ORDERS:
            raise ValueError(f"DefaultScheduler order must be one of {ORDERS}, got {order!r}")
        if admission not in ADMISSIONS:
            raise ValueError(f"DefaultScheduler admission must be one of {ADMISSIONS}, got {admission!r}")
        if max_wait_steps is not None:
            positive_int("DefaultScheduler", "max_wait_steps", max_wait_steps)
            if admission != "budget":
                raise ValueError("DefaultScheduler max_wait_steps bounds the wait that admission='budget' adds; "
                                 f"admission={admission!r} admits the oldest first already")
        if age_bound is not None:
            positive_int("DefaultScheduler", "age_bound", age_bound)
            if order == "arrival":
                raise ValueError("DefaultScheduler age_bound bounds the wait that a budget order adds; "
                                 "order='arrival' serves the oldest first already")
        self.admission = admission
        self.max_wait_steps = max_wait_steps
        self.age_bound = age_bound
        self.prompt_share = float(prompt_share)
        self.eager_verify = eager_verify
        self.risky_windows = risky_windows
        self.order = order

    def _is_eager(self, state: SchedulerState) -> bool:
        """Whether to verify partial windows now: the canonical stream idle and every drafting deterministic
        request's window in one R-row pass."""
        if not self.eager_verify or state.num_passes_in_flight:
            return False
        drafting = [v for v in state.requests if v.is_deterministic and not v.is_prefill and v.num_candidates]
        return 0 < len(drafting) <= state.group and sum(1 + v.num_candidates for v in drafting) <= (
            state.num_canonical_rows)

    def _classify(self, reqs: Sequence[RequestView]) -> tuple[list, ...]:
        """``reqs`` sorted into (due windows, deterministic prompts, risky windows, partial windows, decode rows,
        free prompts), each in the order of ``reqs``: one pass over the requests (every running request, every
        step), the view's properties written out."""
        risky_mode = self.risky_windows
        due, det_prefill, risky, partial, decoding, free_prefill = [], [], [], [], [], []
        for v in reqs:
            if v.num_prefilled < v.num_prompt_tokens:
                (det_prefill if v.is_deterministic else free_prefill).append(v)
            elif not v.is_deterministic:
                decoding.append(v)
            else:
                if v.num_speculable == 0 or (risky_mode == "due" and v.is_risky):
                    due.append(v)
                if v.is_risky:
                    risky.append(v)
                if v.num_speculable:
                    decoding.append(v)
                    if v.num_candidates > 0:
                        partial.append(v)
        return due, det_prefill, risky, partial, decoding, free_prefill

    def _by_budget(self, views: Sequence[RequestView], requests: Sequence[RequestView]) -> Sequence[RequestView]:
        """``views`` in the budget order; with ``age_bound``, those admitted that many admissions or more before the
        newest of ``requests`` first, oldest first."""
        ordered = in_order(views, "budget")
        if self.age_bound is None or not ordered:
            return ordered
        oldest_young = max(v.arrival for v in requests) - self.age_bound + 1  # older than this: over the bound
        old = [v for v in ordered if v.arrival < oldest_young]
        if not old:
            return ordered
        old.sort(key=lambda v: v.arrival)
        return old + [v for v in ordered if v.arrival >= oldest_young]

    def schedule(self, state: SchedulerState) -> Plan:
        if self.order == "canonical_budget":
            # the fast step's rows (decode rows, free prompts) oldest first; the canonical pass's (windows,
            # deterministic prompts) the largest budget left first
            *_, decoding, free_prefill = self._classify(state.requests)
            due, det_prefill, risky, partial, *_ = self._classify(
                self._by_budget([v for v in state.requests if v.is_deterministic], state.requests))
        elif self.order == "budget":
            due, det_prefill, risky, partial, decoding, free_prefill = self._classify(
                self._by_budget(state.requests, state.requests))
        else:
            due, det_prefill, risky, partial, decoding, free_prefill = self._classify(state.requests)
        r, max_windows = state.num_canonical_rows, state.max_windows
        verify: list[int] = []
        rows = 0  # the windows' rows
        risky_mode = self.risky_windows
        if due or det_prefill or self._is_eager(state):
            window_rows = state.max_result_rows
            if det_prefill and self.prompt_share:
                reserve = min(sum(v.num_prompt_remaining for v in det_prefill),
                              int(self.prompt_share * state.max_canonical_rows))
                window_rows = min(window_rows, state.max_canonical_rows - reserve)
            for v in due:
                if len(verify) < max_windows and rows + 1 + v.num_candidates <= window_rows:
                    verify.append(v.rid)
                    rows += 1 + v.num_candidates
            if risky_mode == "ride":  # windows likely rejected ride along first, in any of the pass's window rows
                chosen = set(verify)
                for v in risky:
                    if (v.rid not in chosen and len(verify) < max_windows
                            and rows + 1 + v.num_candidates <= window_rows):
                        verify.append(v.rid)
                        rows += 1 + v.num_candidates
            # partial windows only in the rows the due ones leave in their blocks of R (at least R): free rows
            fill = min(window_rows, max(r, -(-rows // r) * r))
            chosen = set(verify)
            for v in partial:
                if v.rid not in chosen and len(verify) < max_windows and rows + 1 + v.num_candidates <= fill:
                    verify.append(v.rid)
                    rows += 1 + v.num_candidates
        canonical_prefill = []
        results_left = state.max_result_rows - rows  # the result rows left: one per prompt chunk
        rows_left = state.max_canonical_rows - rows
        for v in det_prefill:
            if rows_left == 0 or results_left == 0 or len(verify) + len(canonical_prefill) == r:
                break
            n = min(v.num_prompt_remaining, rows_left)
            canonical_prefill.append(PrefillChunk(v.rid, n))
            rows_left -= n
            results_left -= 1

        if verify:
            in_canonical = set(verify)
            fast_decode = [v.rid for v in decoding if v.rid not in in_canonical][: state.max_fast_tokens]
        else:
            fast_decode = [v.rid for v in decoding[: state.max_fast_tokens]]
        fast_prefill = _prompt_chunks(free_prefill, state.max_fast_tokens - len(fast_decode))
        return Plan(tuple(fast_decode), tuple(fast_prefill), tuple(verify), tuple(canonical_prefill))
