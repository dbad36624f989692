"""The host's per-step bookkeeping, inlined (it runs for every running request every step, or every window of every
pass): for any request state ``Request.view`` equals the view the request's properties give (the benchmark's ``legacy_view``), the
pool shows exactly the requests the property-based filter shows, and ``RequestPool._count_margins`` counts a window's
verified drafts into the buckets the per-draft rule gives. ``benchmarks/cpu_host_step.py`` times the views."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

import bisect
import importlib.util
from pathlib import Path

from llm42 import SamplingParams
from llm42.engine.requests import MARGIN_EDGES, MARGIN_STATS, Request, RequestPool
from llm42.verify.windows import Commit


def _legacy():
    """benchmarks/cpu_host_step.py: the views as the request's properties define them (the engine's before round
    26), which the benchmark times beside the inlined ones."""
    spec = importlib.util.spec_from_file_location("cpu_host_step_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "cpu_host_step.py"
LEGACY = _legacy()


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
    assert req.view(window) == LEGACY.legacy_view(req, window)


@settings(max_examples=300)
@given(reqs=st.lists(requests(), max_size=6), window=st.integers(1, 9), chain=st.booleans())
def test_the_pool_shows_the_requests_the_properties_show(reqs, window, chain):
    pool = RequestPool(max_num_seqs=64, window=window, adaptive_draft=False)
    pool.chain_prefill = chain
    for rid, req in enumerate(reqs):
        req.rid = req.arrival = rid
        pool.running[rid] = req
    assert pool.views() == LEGACY.legacy_views(pool)


def reference_margin_counts(margins: list[float], num_accepted: int, is_rejected: bool, risk_margin: float) -> dict:
    """The per-draft rule (before round 26): each verified draft's bucket by bisect over every edge, capped."""
    keys = [k[len("verified"):] for k in MARGIN_STATS if k.startswith("verified")]
    counts = dict.fromkeys([*MARGIN_STATS, "risky_rollbacks"], 0)
    for i in range(min(len(margins), num_accepted + (1 if is_rejected else 0))):
        bucket = keys[min(bisect.bisect_right(MARGIN_EDGES, margins[i]), len(MARGIN_EDGES) - 1)]
        counts["verified" + bucket] += 1
        if i == num_accepted:
            counts["rejected" + bucket] += 1
            counts["risky_rollbacks"] += margins[i] < risk_margin
    return counts


margins_st = st.floats(0, 4) | st.sampled_from([*MARGIN_EDGES, 0.0]) | st.just(float("nan"))


@settings(max_examples=300)
@given(margins=st.lists(margins_st, max_size=12), data=st.data(), risk_margin=st.sampled_from([0.0, 0.125, 1.0]))
def test_window_margins_fall_in_the_buckets_of_the_per_draft_rule(margins, data, risk_margin):
    num_accepted = data.draw(st.integers(0, len(margins)))
    is_rejected = num_accepted < len(margins) and data.draw(st.booleans())
    req = Request(0, [3], SamplingParams(max_new_tokens=40, deterministic=True), 0, frozenset(), arrival=0, slot=0)
    req.candidate_margins = list(margins)
    req.risk_margin = risk_margin
    pool = RequestPool(max_num_seqs=4, window=16, adaptive_draft=False)
    commit = Commit(0, (5,) * (num_accepted + 1), (0.0,) * (num_accepted + 1), num_accepted, int(is_rejected),
                    1 + num_accepted, False, ())
    pool._count_margins(req, commit)
    expected = reference_margin_counts(margins, num_accepted, is_rejected, risk_margin)
    assert {k: pool.stats[k] for k in expected} == expected
