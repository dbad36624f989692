"""A scheduling rule to A/B (``dvr_ab.py --variants default,batched``): verify-only passes held until they are worth it.

Round 25's table of the SmolLM2 dvr@50 runs of rounds 23-25 (docs/benchmarks.md, "Two regimes of dvr@50"): the runs
with the fewest, widest passes (381-446 passes of 712-828 rows, most plans deferred behind the pass in flight)
reached 0.665-0.734 of nondet at 3.0-3.7 ms a step; the runs with many narrow passes (544-590 of 536-582 rows, few
deferred) 0.466-0.701 at 3.9-6.3 ms a step, among them the default engine twice, in slow processes. A slow step
lets each pass finish before the next plan, so every step launches a pass of whatever windows are due: more passes,
each with its fixed cost, slower steps again. ``BatchedPassScheduler`` breaks that loop: a pass that only verifies
windows (no deterministic prompt waiting) is formed once its windows fill ``min_rows`` rows, or once a due window has
waited ``max_wait`` steps (the engine drafts ahead of a due window meanwhile: a window's worth, so a short wait stalls
no request), or when every deterministic request drafting could not fill ``min_rows`` anyway (a run's tail), or when
the step would have nothing else to run. Otherwise the step runs without a pass, every request that may draft
drafting. Scheduling never changes a committed bit (tests/test_batched_passes.py runs it beside the default and
compares).
"""

from __future__ import annotations

from llm42.scheduler import DefaultScheduler, Plan, fast_prefill_chunks


class BatchedPassScheduler(DefaultScheduler):
    min_rows: int = 512
    max_wait: int = 8

    def __init__(self, *, min_rows: int | None = None, max_wait: int | None = None, **kwargs):
        super().__init__(**kwargs)
        if min_rows is not None:
            self.min_rows = min_rows
        if max_wait is not None:
            self.max_wait = max_wait
        self._due_since: dict[int, int] = {}  # request id -> the step its window was first seen due
        self.num_held = 0  # steps that held a pass back

    def schedule(self, state):
        plan = super().schedule(state)
        due = {v.rid for v in state.requests if v.is_ready_to_verify}
        self._due_since = {rid: self._due_since.get(rid, state.step) for rid in due}
        if not plan.verify or plan.canonical_prefill:
            return plan
        views = {v.rid: v for v in state.requests}
        rows = sum(1 + views[rid].num_candidates for rid in plan.verify)
        drafting = sum(1 + v.num_candidates for v in state.requests
                       if v.is_deterministic and not v.is_prefill and v.num_candidates)
        waited = state.step - min(self._due_since.values(), default=state.step)
        if rows >= min(self.min_rows, drafting) or waited >= self.max_wait:
            for rid in plan.verify:
                self._due_since.pop(rid, None)
            return plan
        fast_decode = [v.rid for v in state.requests if not v.is_prefill
                       and (not v.is_deterministic or v.num_speculable > 0)][: state.max_fast_tokens]
        fast_prefill = fast_prefill_chunks(state, state.max_fast_tokens - len(fast_decode))
        if not fast_decode and not fast_prefill:  # nothing else to run: holding would only idle the step
            return plan
        self.num_held += 1
        return Plan(tuple(fast_decode), tuple(fast_prefill))


def batched(min_rows: int, max_wait: int) -> type:
    """A ``BatchedPassScheduler`` class with these thresholds (the benchmarks' ``Engine.scheduler_class``)."""
    return type(f"BatchedPassScheduler_{min_rows}_{max_wait}", (BatchedPassScheduler,),
                {"min_rows": min_rows, "max_wait": max_wait})
