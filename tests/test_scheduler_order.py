"""DefaultScheduler(order="budget"): requests with the largest output budget left are served first wherever rows are
short (prompt chunks of both kinds, due and partial windows); ``"arrival"`` serves the oldest first;
``"canonical_budget"`` (the default since round 44) the canonical pass's rows as ``"budget"``, the fast step's as
``"arrival"``.
Scheduling never changes a committed bit; what the order changes is who starts first."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm42 import DefaultScheduler, DVRGenerator, SamplingParams
from llm42.engine.requests import Request, RequestPool
from llm42.model.weights import random_weights
from llm42.scheduler import (
    ADMISSIONS,
    ORDERS,
    RequestView,
    SchedulerState,
    in_order,
    validate_plan,
)
from tests.helpers import first_token_steps, run_dvr_ab, tiny_config
from tests.property.schedulers import RecordingScheduler

WINDOW, GROUP = 4, 2  # R = 8


def _view(rid: int, *, budget: int | None, generated: int = 0, prompt: int = 6, prefilled: int = 6,
          candidates: int = 0, speculable: int = 0, deterministic: bool = True) -> RequestView:
    return RequestView(rid, deterministic, prompt, prefilled, generated, candidates, speculable, rid, False, budget)


def test_budget_order_serves_the_largest_budget_left_first_oldest_among_equals_unknown_last():
    views = [_view(0, budget=10, generated=8), _view(1, budget=None), _view(2, budget=50, generated=10),
             _view(3, budget=40), _view(4, budget=12)]
    assert [v.rid for v in in_order(views, "budget")] == [2, 3, 4, 0, 1]  # left: 40, 40, 12, 2, unknown
    assert [v.num_budget_left for v in views] == [2, None, 40, 40, 12]
    assert in_order(views, "arrival") == views


@pytest.mark.parametrize("bad", ["fifo", None, 1])
def test_a_bad_order_is_refused_naming_the_field(bad):
    with pytest.raises(ValueError, match="order"):
        DefaultScheduler(order=bad)
    with pytest.raises(ValueError, match="order"):
        in_order([_view(0, budget=1)], bad)


def _state(views, *, max_canonical_rows: int = 16) -> SchedulerState:
    return SchedulerState(tuple(views), WINDOW, GROUP, 64, 0, max_canonical_rows, max_canonical_rows)


def test_budget_order_gives_a_pass_s_rows_to_the_prompt_that_may_produce_most():
    # three deterministic prompts of 16 rows each, one pass of 16 rows: only one is chunked this step
    views = [_view(rid, budget=budget, prompt=16, prefilled=0) for rid, budget in enumerate((8, 64, 32))]
    state = _state(views)
    oldest = DefaultScheduler(order="arrival").schedule(state)
    longest = DefaultScheduler(order="budget").schedule(state)
    for plan in (oldest, longest):
        validate_plan(plan, state)
    assert [c.rid for c in oldest.canonical_prefill] == [0]  # the negative control: the oldest first
    assert [c.rid for c in longest.canonical_prefill] == [1]


def test_budget_order_verifies_first_the_due_windows_of_requests_that_may_produce_most():
    # six due windows of 4 rows, a pass of 16 rows: four fit
    views = [_view(rid, budget=budget, generated=2, candidates=WINDOW - 1)
             for rid, budget in enumerate((10, 90, 20, 80, 30, 70))]
    state = _state(views)
    assert DefaultScheduler(order="arrival").schedule(state).verify == (0, 1, 2, 3)
    assert DefaultScheduler(order="budget").schedule(state).verify == (1, 3, 5, 4)


def test_budget_order_takes_free_prompt_chunks_by_budget_too():
    views = [_view(rid, budget=budget, prompt=40, prefilled=0, deterministic=False)
             for rid, budget in enumerate((8, 64))]
    state = _state(views)
    assert [c.rid for c in DefaultScheduler(order="arrival").schedule(state).fast_prefill] == [0, 1]
    assert [c.rid for c in DefaultScheduler(order="budget").schedule(state).fast_prefill] == [1, 0]


CFG = tiny_config(max_position_embeddings=256)
WEIGHTS = random_weights(CFG, seed=5)
PROMPTS = [[(5 * i + 3 * j) % (CFG.vocab_size - 3) + 3 for j in range(40)] for i in range(12)]
BUDGETS = [6] * 11 + [40]  # the last request may produce the most


def _run(scheduler):
    gen = DVRGenerator(WEIGHTS, CFG, window=WINDOW, group=GROUP, kv_cache_tokens=4096, block_size=8,
                       max_fast_tokens=64, max_canonical_tokens=16, wide_verify=True, max_num_seqs=64,
                       scheduler=RecordingScheduler(scheduler))
    params = [SamplingParams(max_new_tokens=n, deterministic=True, ignore_eos=True, seed=i,
                             temperature=0.9 if i % 2 else 0.0, top_k=20) for i, n in enumerate(BUDGETS)]
    rids = [gen.submit(p, params[i]) for i, p in enumerate(PROMPTS)]
    first = first_token_steps(gen)
    return [gen.result(r).token_ids for r in rids], first[rids[-1]], gen.scheduler.history


def test_budget_order_starts_the_longest_request_sooner_and_commits_the_same_bits():
    base_out, base_first, history = _run(DefaultScheduler(order="arrival"))
    budget_out, budget_first, _ = _run(DefaultScheduler(order="budget"))
    assert budget_out == base_out
    assert all(len(out) == n for out, n in zip(base_out, BUDGETS))
    assert all(v.max_new_tokens == BUDGETS[v.rid] for state, _ in history for v in state.requests)
    assert budget_first < base_first, (budget_first, base_first)


def test_every_order_is_named():
    assert ORDERS == ("arrival", "budget", "canonical_budget")


def test_canonical_budget_orders_the_pass_by_budget_and_the_fast_step_by_arrival():
    """``order="canonical_budget"``: a pass's prompt chunks and windows go as in ``"budget"``, the fast step's free
    prompt chunks and decode rows as in ``"arrival"`` (each compared with both orders: the controls)."""
    det_prompts = [_view(rid, budget=budget, prompt=16, prefilled=0) for rid, budget in enumerate((8, 64, 32))]
    due = [_view(rid, budget=budget, generated=2, candidates=WINDOW - 1)
           for rid, budget in enumerate((10, 90, 20, 80, 30, 70))]
    free_prompts = [_view(rid, budget=budget, prompt=40, prefilled=0, deterministic=False)
                    for rid, budget in enumerate((8, 64))]
    mixed = _state(det_prompts[:1] + [v._replace(rid=v.rid + 10, arrival=v.rid + 10) for v in free_prompts])
    plans = {order: {name: DefaultScheduler(order=order).schedule(state) for name, state in (
        ("det_prompts", _state(det_prompts)), ("due", _state(due)), ("free_prompts", _state(free_prompts)),
        ("mixed", mixed))} for order in ORDERS}
    for name in ("det_prompts", "due"):  # the pass: as "budget", unlike "arrival"
        assert plans["canonical_budget"][name] == plans["budget"][name] != plans["arrival"][name]
    # the fast step: as "arrival", unlike "budget"
    assert plans["canonical_budget"]["free_prompts"] == plans["arrival"]["free_prompts"] != plans["budget"][
        "free_prompts"]
    assert [c.rid for c in plans["canonical_budget"]["mixed"].fast_prefill] == [10, 11]
    # over-long decode rows (64 fast rows, 70 decoding): the oldest keep their rows, as in "arrival"
    decoding = [_view(rid, budget=rid + 1, deterministic=False) for rid in range(70)]
    fast = {order: DefaultScheduler(order=order).schedule(_state(decoding)).fast_decode for order in ORDERS}
    assert fast["canonical_budget"] == fast["arrival"] == tuple(range(64)) != fast["budget"]
    # an order over two kinds of rows, not one list's: in_order refuses it, naming the field
    with pytest.raises(ValueError, match="order"):
        in_order(due, "canonical_budget")


@settings(max_examples=200, deadline=None)
@given(budgets=st.lists(st.tuples(st.integers(1, 60), st.integers(0, 50), st.booleans()), min_size=1, max_size=20),
       max_fast=st.integers(1, 80))
def test_canonical_budget_schedules_free_requests_alone_as_arrival_does(budgets, max_fast):
    """Without deterministic requests, ``"canonical_budget"`` plans exactly what ``"arrival"`` plans."""
    views = [_view(rid, budget=budget, prompt=40, prefilled=min(prefilled, 40) if decoding else 0, deterministic=False)
             for rid, (budget, prefilled, decoding) in enumerate(budgets)]
    state = SchedulerState(tuple(views), WINDOW, GROUP, max_fast, 0, 16, 16)
    assert (DefaultScheduler(order="canonical_budget").schedule(state)
            == DefaultScheduler(order="arrival").schedule(state))


def test_canonical_budget_commits_the_same_bits():
    base_out, base_first, _ = _run(DefaultScheduler(order="arrival"))
    out, first, _ = _run(DefaultScheduler(order="canonical_budget"))
    assert out == base_out
    assert first < base_first, (first, base_first)  # every request is deterministic here: as "budget"


def _run_admission(scheduler, *, kv_cache_tokens: int):
    """Twelve requests whose worst cases do not all fit the K/V store at once (each reserves 40 + its budget
    positions), the one that may produce most submitted last; their outputs and first-token steps."""
    gen = DVRGenerator(WEIGHTS, CFG, window=WINDOW, group=GROUP, kv_cache_tokens=kv_cache_tokens, block_size=8,
                       max_fast_tokens=64, max_canonical_tokens=16, wide_verify=True, max_num_seqs=64,
                       scheduler=scheduler)
    params = [SamplingParams(max_new_tokens=n, deterministic=i % 3 != 0, ignore_eos=True, seed=i,
                             temperature=0.9 if i % 2 else 0.0, top_k=20) for i, n in enumerate(BUDGETS)]
    rids = [gen.submit(p, params[i]) for i, p in enumerate(PROMPTS)]
    first = first_token_steps(gen)
    return [gen.result(r).token_ids for r in rids], [first[r] for r in rids], gen


def test_budget_admission_admits_the_largest_budget_first_where_k_v_is_short_and_commits_the_same_bits():
    # 208 positions in blocks of 8: the 80-position request and two of the 46 (48)-position ones, or four of those
    arrival_out, arrival_first, arrival_gen = _run_admission(DefaultScheduler(order="budget"), kv_cache_tokens=208)
    budget_out, budget_first, gen = _run_admission(DefaultScheduler(order="budget", admission="budget"),
                                                   kv_cache_tokens=208)
    deterministic = [i for i in range(len(PROMPTS)) if i % 3 != 0]
    assert [budget_out[i] for i in deterministic] == [arrival_out[i] for i in deterministic]
    assert all(len(out) == n for out, n in zip(budget_out, BUDGETS))
    # the negative control: admitted in arrival order, the longest request starts after every other
    assert arrival_first[-1] == max(arrival_first), arrival_first
    # admitted first by budget, it has its first token in the first steps (request 0, free, at once beside it)
    assert budget_first[-1] <= sorted(budget_first)[1] < arrival_first[-1], (budget_first, arrival_first)
    # and the run is no longer as long as the last request's prompt wait plus its 40 tokens (48 steps against 64)
    assert gen.stats["steps"] < arrival_gen.stats["steps"]


def test_budget_admission_admits_everything_at_once_where_everything_fits():
    for admission in ADMISSIONS:
        gen = DVRGenerator(WEIGHTS, CFG, window=WINDOW, group=GROUP, kv_cache_tokens=4096, block_size=8,
                           max_num_seqs=64, scheduler=DefaultScheduler(admission=admission))
        for i, p in enumerate(PROMPTS):
            gen.submit(p, SamplingParams(max_new_tokens=BUDGETS[i], deterministic=True, ignore_eos=True))
        gen.step()
        assert gen.num_waiting == 0 and gen.num_running == len(PROMPTS), admission


@pytest.mark.parametrize("bad", ["fifo", None, "Budget"])
def test_a_bad_admission_is_refused_naming_the_field(bad):
    with pytest.raises(ValueError, match="admission"):
        DefaultScheduler(admission=bad)

    class Odd:
        admission = bad

        def schedule(self, state):
            return DefaultScheduler().schedule(state)

    with pytest.raises(ValueError, match="admission"):
        DVRGenerator(WEIGHTS, CFG, window=WINDOW, group=GROUP, kv_cache_tokens=512, scheduler=Odd())


class _NoAdmission:
    """A scheduler with no ``admission`` attribute (the default scheduler's plans)."""

    def __init__(self):
        self._inner = DefaultScheduler(admission="budget")

    def schedule(self, state):
        return self._inner.schedule(state)


def test_a_scheduler_without_admission_admits_in_arrival_order():
    out, first, _ = _run_admission(_NoAdmission(), kv_cache_tokens=208)
    base_out, base_first, _ = _run_admission(DefaultScheduler(), kv_cache_tokens=208)
    assert not hasattr(_NoAdmission(), "admission")
    assert (out, first) == (base_out, base_first)
    # a wrapper that forwards it (tests' RecordingScheduler) admits as its inner scheduler does
    budget = _run_admission(DefaultScheduler(admission="budget"), kv_cache_tokens=208)[1]
    assert _run_admission(RecordingScheduler(DefaultScheduler(admission="budget")), kv_cache_tokens=208)[1] == budget
    assert budget != base_first


def test_dvr_ab_serves_the_budget_admission_variant_with_the_same_outputs(tmp_path, monkeypatch):
    """The benchmark's variant (benchmarks/device/dvr_ab.py, for the next device session) end to end on the CPU: the
    same deterministic outputs as the budget order alone."""
    got = run_dvr_ab(tmp_path / "ab.json", monkeypatch,
                     "order_budget,order_budget_admit,admit_budget,admit_budget_wait_500", "--num-requests", "4")
    checks = got["deterministic_outputs_identical"]
    assert len(checks) == 3
    for check in checks.values():
        assert check["num_checked"] > 0 and check["num_identical"] == check["num_checked"]
    assert got["variants"]["order_budget_admit"] == {"scheduler_order": "budget", "scheduler_admission": "budget"}
    assert got["variants"]["admit_budget"] == {"scheduler_admission": "budget"}
    assert got["variants"]["admit_budget_wait_500"] == {"scheduler_admission": "budget",
                                                        "scheduler_max_wait_steps": 500}


def test_the_order_and_admission_step_model_runs_every_pair_with_the_same_bits(tmp_path):
    """benchmarks/cpu_order_admission.py, small: the four (order, admission) pairs commit the same bits."""
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "cpu_order_admission.py"
    spec = importlib.util.spec_from_file_location("cpu_order_admission", script)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    got = bench.main(["--num-requests", "16", "--lags", "2", "--out", str(tmp_path / "out.json")])
    assert got["same_bits"] and len(got["cases"]) == 4
    assert all(case["num_deterministic"] == 8 and case["steps"] > 0 for case in got["cases"].values())


@settings(max_examples=100, deadline=None)
@given(budgets=st.lists(st.integers(1, 6), max_size=20))
def test_the_waiting_queue_keeps_the_admission_order_as_requests_arrive(budgets):
    """``RequestPool.enqueue`` keeps ``admission="budget"``'s queue sorted by budget, oldest first among equals (the
    rule a stable sort gives); ``"arrival"`` keeps submission order."""
    pools = {a: RequestPool(max_num_seqs=4, window=4, adaptive_draft=False, admission=a) for a in ADMISSIONS}
    reqs = [Request(rid, [3], SamplingParams(max_new_tokens=n), 0, frozenset()) for rid, n in enumerate(budgets)]
    for req in reqs:
        for pool in pools.values():
            pool.enqueue(req)
    assert list(pools["arrival"].waiting) == reqs
    assert list(pools["budget"].waiting) == sorted(reqs, key=lambda r: -r.max_new_tokens)


def test_the_kv_bound_admission_model_starts_the_longest_replies_first(tmp_path):
    """benchmarks/cpu_admission_kv.py, small: with a K/V store that holds a fraction of the set, admission by budget
    serves every token of the set in fewer steps than admission by arrival, and the longest reply starts no later."""
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "cpu_admission_kv.py"
    spec = importlib.util.spec_from_file_location("cpu_admission_kv", script)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    got = bench.main(["--num-requests", "40", "--kv-tokens", "6000", "--max-num-seqs", "64",
                      "--max-fast-tokens", "256", "--out", str(tmp_path / "out.json")])
    case = got["cases"]["kv_6000"]
    arrival, budget = case["arrival"], case["budget"]
    assert arrival["output_tokens"] == budget["output_tokens"] > 0
    assert budget["steps"] < arrival["steps"]
    longest = budget["longest_replies"][0]
    assert longest["first_token_step"] <= min(r["first_token_step"] for r in arrival["longest_replies"][:1])


class _FitsAll:
    """A K/V store for the pool alone: every request fits; no prefix is cached."""

    block_size = 8

    def match_prefix(self, prompt):
        return []

    def can_allocate(self, num_tokens, prefix):
        return True

    def allocate(self, rid, num_tokens, prefix):
        pass


@settings(max_examples=100, deadline=None)
@given(arrivals=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 9)), min_size=1, max_size=24),
       wait=st.one_of(st.none(), st.integers(1, 6)))
def test_budget_admission_admits_a_request_that_waited_max_wait_steps_next(arrivals, wait):
    """One seat, freed every step; each step some requests arrive (budgets drawn). The pool admits the oldest
    request queued ``max_wait_steps`` or more steps ago where there is one, else the largest budget (oldest among
    equals); with the bound, no request waits more than the bound plus the requests queued before it."""
    pool = RequestPool(max_num_seqs=1, window=4, adaptive_draft=False, admission="budget", max_wait_steps=wait)
    kv, rid, step, waited, out_of_order = _FitsAll(), 0, 0, {}, 0
    pending = list(arrivals)
    while pending or pool.waiting:
        if pending:
            for _ in range(pending[0][0]):
                pool.enqueue(Request(rid, [3], SamplingParams(max_new_tokens=pending[0][1] + rid % 3), 0,
                                     frozenset()), step)
                rid += 1
            pending.pop(0)
        queued = list(pool.waiting)
        aged = [r for r in sorted(queued, key=lambda r: r.rid) if wait is not None and step - r.submitted_step >= wait]
        got = pool.admit(kv, step)
        if queued:
            expected = aged[0] if aged else queued[0]
            assert got == [expected]
            assert queued[0] is max(queued, key=lambda r: (r.max_new_tokens, -r.rid))
            waited[expected.rid] = step - expected.submitted_step
            out_of_order += expected is not queued[0]
            pool.running.clear()  # the seat frees
            pool._free_slots.append(expected.slot)
        step += 1
    assert sorted(waited) == list(range(rid))
    if wait is not None:
        assert all(w <= wait + r for r, w in waited.items()), waited
    assert pool.stats["admitted_by_wait"] == out_of_order


def _stream(scheduler, *, num_long: int = 10):
    """Two seats, filled by two long deterministic requests; a short one submitted behind them, then a long one
    every step for ``num_long`` steps: every output, the step of the short request's first token and each
    request's first-token step."""
    gen = DVRGenerator(WEIGHTS, CFG, window=WINDOW, group=GROUP, kv_cache_tokens=4096, block_size=8,
                       max_num_seqs=2, max_fast_tokens=64, max_canonical_tokens=16, scheduler=scheduler)

    def submit(i: int, budget: int) -> int:
        return gen.submit(PROMPTS[i % len(PROMPTS)][i // len(PROMPTS):][:12], SamplingParams(max_new_tokens=budget, deterministic=True,
                                                           ignore_eos=True, seed=i))

    rids = [submit(0, 12), submit(1, 12)]
    short = submit(2, 4)
    rids.append(short)
    first, step = {}, 0
    while gen.has_unfinished() or len(rids) < 3 + num_long:
        if len(rids) < 3 + num_long:
            rids.append(submit(len(rids), 12))
        for r in gen.step():
            first.setdefault(r, step)
        step += 1
    return [gen.result(r).token_ids for r in rids], first[short], first, gen.stats


def test_a_wait_bound_admits_a_short_request_that_a_stream_of_long_ones_would_keep_queued():
    arrival_out, arrival_first, _, _ = _stream(DefaultScheduler())
    unbounded_out, unbounded_first, first, _ = _stream(DefaultScheduler(admission="budget"))
    bounded_out, bounded_first, _, stats = _stream(DefaultScheduler(admission="budget", max_wait_steps=3))
    assert bounded_out == unbounded_out == arrival_out  # the same bits, whatever the admission order
    # the negative control: without a bound the short request is admitted after every long one
    assert unbounded_first == max(first.values()), (unbounded_first, first)
    # with it, as soon as a seat frees after its 3 steps: as arrival order admits it
    assert bounded_first < unbounded_first, (bounded_first, unbounded_first)
    assert bounded_first == arrival_first, (bounded_first, arrival_first)
    assert stats["admitted_by_wait"] >= 1


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-2, ValueError), (True, TypeError), (2.0, TypeError)])
def test_a_bad_wait_bound_is_refused_naming_the_field(bad, error):
    with pytest.raises(error, match="max_wait_steps"):
        DefaultScheduler(admission="budget", max_wait_steps=bad)

    class Odd:
        admission = "budget"
        max_wait_steps = bad

        def schedule(self, state):
            return DefaultScheduler().schedule(state)

    with pytest.raises(error, match="max_wait_steps"):
        DVRGenerator(WEIGHTS, CFG, window=WINDOW, group=GROUP, kv_cache_tokens=512, scheduler=Odd())


def test_a_wait_bound_needs_admission_by_budget():
    with pytest.raises(ValueError, match="max_wait_steps"):
        DefaultScheduler(max_wait_steps=4)


def test_an_age_bound_serves_a_request_kept_behind_longer_ones_first():
    """``age_bound=N``: a due window admitted N admissions or more before the newest running request is verified
    before younger ones with more budget left (oldest first); without the bound it waits behind them (the negative
    control), and with a larger bound it is not old yet."""
    # five due windows of 4 rows, a pass of 16 rows: four fit; request 0 (admitted first) has the least budget left
    views = [_view(0, budget=10, generated=8, candidates=WINDOW - 1)] + [
        _view(rid, budget=90, generated=2, candidates=WINDOW - 1) for rid in range(1, 5)]
    state = _state(views)
    for order in ("budget", "canonical_budget"):
        assert DefaultScheduler(order=order).schedule(state).verify == (1, 2, 3, 4)  # 0 waits
        assert DefaultScheduler(order=order, age_bound=4).schedule(state).verify == (0, 1, 2, 3)  # 4 - 0 >= 4
        assert DefaultScheduler(order=order, age_bound=5).schedule(state).verify == (1, 2, 3, 4)  # not old yet
    # free requests keep their order under canonical_budget's bound (its fast rows go by arrival anyway)
    free = [_view(rid, budget=budget, prompt=40, prefilled=0, deterministic=False) for rid, budget in
            enumerate((8, 64, 32))]
    assert [c.rid for c in DefaultScheduler(order="canonical_budget", age_bound=1).schedule(
        _state(free)).fast_prefill] == [0, 1]


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-2, ValueError), (True, TypeError), ("8", TypeError),
                                        (2.0, TypeError)])
def test_a_bad_age_bound_is_refused_naming_the_field(bad, error):
    with pytest.raises(error, match="age_bound"):
        DefaultScheduler(age_bound=bad)


def test_an_age_bound_needs_a_budget_order():
    with pytest.raises(ValueError, match="age_bound"):
        DefaultScheduler(order="arrival", age_bound=8)


def test_an_age_bound_commits_the_same_bits():
    base_out, _, _ = _run(DefaultScheduler(order="arrival"))
    out, _, _ = _run(DefaultScheduler(age_bound=2))
    assert out == base_out
