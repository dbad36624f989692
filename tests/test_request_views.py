"""``Request.view`` / ``RequestPool.views`` inline the request's properties (they run for every running request every
step): for any request state the inlined view equals the one the properties give (``reference_view``), and the pool
shows exactly the requests the property-based filter shows. ``benchmarks/cpu_host_step.py`` times the two."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from llm42 import SamplingParams
from llm42.engine.requests import Request, RequestPool
from llm42.scheduler import RequestView


def reference_view(req: Request, window: int) -> RequestView:
    """The view as the properties define it (the engine's before round 26)."""
    if req.is_deterministic:
        depth = req.window_depth(window)
        return RequestView(req.rid, True, req.num_prompt_tokens, req.prefill_frontier, len(req.token_ids),
                           min(req.num_candidates, depth), req.num_speculable(window), req.arrival,
                           bool(req.risky) and req.risky[0] < depth, req.max_new_tokens)
    return RequestView(req.rid, False, req.num_prompt_tokens, req.num_prefilled,
                       len(req.token_ids) + req.num_pending, 0, 0, req.arrival, False, req.max_new_tokens)


def reference_views(pool: RequestPool) -> tuple[RequestView, ...]:
    chain = pool.chain_prefill
    return tuple(reference_view(r, pool.window) for r in pool.running.values()
                 if (not r.is_verifying or (chain and r.is_chainable())) and r.num_generated < r.max_new_tokens)


STOP = 7


@st.composite
def requests(draw, rid: int = 0) -> Request:
    deterministic = draw(st.booleans())
    prompt_len = draw(st.integers(1, 12))
    max_new = draw(st.integers(1, 40))
    req = Request(rid, [3] * prompt_len, SamplingParams(max_new_tokens=max_new, deterministic=deterministic), 0,
                  frozenset({STOP}), arrival=rid, slot=rid)
    req.num_prefilled = draw(st.integers(0, prompt_len))
    req.num_prefill_launched = draw(st.integers(0, prompt_len))
    req.token_ids = [5] * draw(st.integers(0, max_new))
    req.num_pending = draw(st.integers(0, 3))
    req.num_discard = draw(st.integers(0, req.num_pending))
    req.num_passes = draw(st.integers(0, 2))
    if deterministic:
        num = draw(st.integers(0, 12))
        req.candidates = draw(st.lists(st.sampled_from([5, 6, STOP]), min_size=num, max_size=num))
        req.candidate_margins = [1.0] * num
        req.risky = sorted(draw(st.sets(st.integers(0, max(num - 1, 0)), max_size=3))) if num else []
        req.draft_limit = draw(st.none() | st.integers(1, 10))
        req.ahead_check = draw(st.none() | st.just(5)) if req.num_pending > req.num_discard else None
    return req


@settings(max_examples=500)  # microseconds each: enough draws that every branch of the view is taken
@given(req=requests(), window=st.integers(1, 9))
def test_the_inlined_view_equals_the_properties(req, window):
    assert req.view(window) == reference_view(req, window)


@settings(max_examples=300)
@given(reqs=st.lists(requests(), max_size=6), window=st.integers(1, 9), chain=st.booleans())
def test_the_pool_shows_the_requests_the_properties_show(reqs, window, chain):
    pool = RequestPool(max_num_seqs=64, window=window, adaptive_draft=False)
    pool.chain_prefill = chain
    for rid, req in enumerate(reqs):
        req.rid = req.arrival = rid
        pool.running[rid] = req
    assert pool.views() == reference_views(pool)
