"""``DefaultScheduler.schedule`` classifies the requests in one pass (round 28: it runs over every running request
every step; the pass cut its host time ~3x at 1,000 requests, ``benchmarks/cpu_host_ab.py``). The plans must be the
ones the earlier rule made, a list per question, kept here as the reference: on random states, with every knob.
Negative control: a reference that forgets to keep a verified partial window out of the fast decode rows gives
other plans on these states, so the comparison sees a wrong row."""

from __future__ import annotations

from hypothesis import find, given, settings
from hypothesis import strategies as st

from llm42.scheduler import (DefaultScheduler, Plan, PrefillChunk, RequestView, SchedulerState, fast_prefill_chunks,
                             in_order, validate_plan)


def reference_schedule(self: DefaultScheduler, state: SchedulerState, *, keep_verified_out: bool = True) -> Plan:
    """The schedule before round 28 (a list comprehension per question over the requests)."""
    # the canonical pass's rows by budget under "budget" and "canonical_budget", the fast step's under "budget" only
    reqs = _aged(self, in_order(state.requests, "budget" if self.order in ("budget", "canonical_budget")
                                else "arrival"), state.requests)
    fast_reqs = _aged(self, in_order(state.requests, "budget" if self.order == "budget" else "arrival"),
                      state.requests)
    r, max_windows = state.num_canonical_rows, state.max_windows
    verify: list[int] = []
    rows = 0
    risky_mode = self.risky_windows
    due = [v for v in reqs if v.is_ready_to_verify or (
        risky_mode == "due" and v.is_risky and v.is_deterministic and not v.is_prefill)]
    det_prefill = [v for v in reqs if v.is_deterministic and v.is_prefill]
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
        if risky_mode == "ride":
            chosen = set(verify)
            for v in reqs:
                if (v.is_risky and v.rid not in chosen and not v.is_prefill and len(verify) < max_windows
                        and rows + 1 + v.num_candidates <= window_rows):
                    verify.append(v.rid)
                    rows += 1 + v.num_candidates
        fill = min(window_rows, max(r, -(-rows // r) * r))
        chosen = set(verify)
        for v in reqs:
            if (v.is_deterministic and not v.is_prefill and not v.is_ready_to_verify and v.rid not in chosen
                    and v.num_candidates > 0
                    and len(verify) < max_windows and rows + 1 + v.num_candidates <= fill):
                verify.append(v.rid)
                rows += 1 + v.num_candidates
    canonical_prefill = []
    results_left = state.max_result_rows - rows
    rows_left = state.max_canonical_rows - rows
    for v in det_prefill:
        if rows_left == 0 or results_left == 0 or len(verify) + len(canonical_prefill) == r:
            break
        n = min(v.num_prompt_remaining, rows_left)
        canonical_prefill.append(PrefillChunk(v.rid, n))
        rows_left -= n
        results_left -= 1
    in_canonical = set(verify) if keep_verified_out else set()
    fast_decode = [v.rid for v in fast_reqs if not v.is_prefill and v.rid not in in_canonical
                   and (not v.is_deterministic or v.num_speculable > 0)][: state.max_fast_tokens]
    if self.age_bound is None:
        fast_prefill = fast_prefill_chunks(state, state.max_fast_tokens - len(fast_decode), order=self.order)
    else:  # the building block knows no age bound: the free prompts in the fast rows' order
        budget, fast_prefill = state.max_fast_tokens - len(fast_decode), []
        for v in fast_reqs:
            if v.is_prefill and not v.is_deterministic and budget > 0:
                fast_prefill.append(PrefillChunk(v.rid, min(v.num_prompt_remaining, budget)))
                budget -= fast_prefill[-1].num_tokens
    return Plan(tuple(fast_decode), tuple(fast_prefill), tuple(verify), tuple(canonical_prefill))


def _aged(self: DefaultScheduler, ordered, requests):
    """``ordered`` with ``age_bound``'s rule applied where a budget order made it: the requests admitted
    ``age_bound`` admissions or more before the newest first, oldest first (a stable sort on one key)."""
    if self.age_bound is None or self.order == "arrival" or not requests:
        return ordered
    newest = max(v.arrival for v in requests)
    return sorted(ordered, key=lambda v: (0, v.arrival) if newest - v.arrival >= self.age_bound else (1, 0))


WINDOW, GROUP = 4, 2  # R = 8


@st.composite
def views(draw) -> tuple[RequestView, ...]:
    out = []
    for rid in range(draw(st.integers(0, 14))):
        det = draw(st.booleans())
        prompt = draw(st.integers(1, 12))
        prefilled = draw(st.sampled_from([prompt, prompt, draw(st.integers(0, prompt))]))
        budget = draw(st.integers(1, 40))
        generated = draw(st.integers(0, budget - 1))
        candidates = speculable = 0
        risky = False
        if det and prefilled == prompt:
            candidates = draw(st.integers(0, WINDOW - 1))
            speculable = draw(st.integers(0, WINDOW - 1 - candidates))
            risky = candidates > 0 and draw(st.booleans())
        out.append(RequestView(rid, det, prompt, prefilled, generated, candidates, speculable, rid, risky,
                               draw(st.sampled_from([budget, None]))))
    return tuple(out)


@settings(max_examples=400, deadline=None)
@given(requests=views(), risky=st.sampled_from(["ride", "due", "off"]), order=st.sampled_from(["arrival", "budget", "canonical_budget"]),
       share=st.sampled_from([0.0, 0.5]), eager=st.booleans(), max_fast=st.integers(1, 24),
       max_canonical=st.sampled_from([8, 16, 32]), in_flight=st.integers(0, 2), age=st.sampled_from([None, 1, 4]))
def test_the_one_pass_schedule_makes_the_reference_plans(requests, risky, order, share, eager, max_fast,
                                                          max_canonical, in_flight, age):
    state = SchedulerState(requests, WINDOW, GROUP, max_fast, 0, max_canonical, max_canonical, in_flight)
    scheduler = DefaultScheduler(risky_windows=risky, order=order, prompt_share=share, eager_verify=eager,
                                 age_bound=None if order == "arrival" else age)
    plan = scheduler.schedule(state)
    validate_plan(plan, state)
    assert plan == reference_schedule(scheduler, state)


def test_the_comparison_sees_a_verified_window_among_the_decode_rows():
    """Negative control: a partial window (candidates, speculable) joins the pass a due window forms; the faulty
    reference also drafts it in the fast step."""
    requests = (RequestView(0, True, 4, 4, 0, WINDOW - 1, 0, 0, False, 20),
                RequestView(1, True, 4, 4, 0, 1, 2, 1, False, 20))
    state = SchedulerState(requests, WINDOW, GROUP, 8, 0, 8, 8, 0)
    scheduler = DefaultScheduler()
    plan = scheduler.schedule(state)
    assert plan.verify == (0, 1) and plan.fast_decode == ()
    assert plan == reference_schedule(scheduler, state)
    assert plan != reference_schedule(scheduler, state, keep_verified_out=False)


def test_the_states_reach_plans_with_every_part():
    """Not vacuous: the strategy reaches states whose plan has windows (a partial one among them), deterministic
    and free prompt chunks and decode rows in one step."""
    def is_full(requests) -> bool:
        state = SchedulerState(requests, WINDOW, GROUP, 24, 0, 16, 16, 0)
        plan = DefaultScheduler().schedule(state)
        partial = {v.rid for v in requests if v.num_speculable}
        return bool(plan.verify and plan.fast_decode and plan.canonical_prefill and plan.fast_prefill
                    and partial.intersection(plan.verify))

    assert is_full(find(views(), is_full, settings=settings(max_examples=2000, database=None)))
