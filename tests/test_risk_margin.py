"""Draft margins (``llm42.sampler.sample_with_margins``) and windows closed at a risky draft
(``DVRGenerator(risk_margin=)``).

A draft's margin is how far, in logits, the fast path's choice was from going to another token. The sampler
test proves the property the engine relies on: moving every logit by less than half the margin cannot change the
token, and moving the runner-up by more than the margin does (the negative control). The engine tests prove that
a window ends at its first risky draft (and, as the control, that a window built without the cut holds risky
drafts before its end, so the check can fail), that the committed bits are those of the engine without the cut
and of a fast path without noise, and that the margin counters add up to what the passes verified.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from llm42 import DVRGenerator, SamplingParams
from llm42.engine.requests import MARGIN_STATS, Request
from llm42.model.weights import random_weights
from llm42.policies import NoisyFastPolicy
from llm42.scheduler import DefaultScheduler, RequestView, SchedulerState
from llm42.sampler import SamplingRows, gumbel_noise, sample, sample_with_margins
from llm42.testing import strategies as ls
from tests.helpers import record_launches, serve

CFG = ls.wide_model_config(vocab_size=256, max_position_embeddings=128)
WEIGHTS = random_weights(CFG, seed=5)
WINDOW, GROUP = 6, 2


def _rows(temperatures: list[float], seeds: list[int], positions: list[int]) -> SamplingRows:
    n = len(temperatures)
    return SamplingRows(temperature=torch.tensor(temperatures, dtype=torch.float32),
                        top_k=torch.zeros(n, dtype=torch.int64), top_p=torch.ones(n, dtype=torch.float32),
                        seeds=torch.tensor(seeds, dtype=torch.int64), positions=torch.tensor(positions))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), scale=st.sampled_from([0.5, 2.0, 6.0]),
       temperatures=st.lists(st.sampled_from([0.0, 0.0, 0.5, 0.8, 1.3]), min_size=2, max_size=8))
def test_a_move_under_half_the_margin_keeps_the_token_and_one_over_it_does_not(seed, scale, temperatures):
    n, vocab = len(temperatures), 97
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, vocab, generator=gen) * scale
    rows = _rows(temperatures, [seed % 1000 + i for i in range(n)], [5 + i for i in range(n)])
    tokens, logprobs = sample(logits, rows)
    tokens2, logprobs2, margins = sample_with_margins(logits, rows)
    assert torch.equal(tokens, tokens2) and torch.equal(logprobs, logprobs2)  # the same bits, margins beside
    assert bool((margins >= 0).all())
    for i, t in enumerate(temperatures):  # a greedy row's margin: its two largest logits apart
        if t == 0.0:
            top2 = logits[i].topk(2).values
            assert float(margins[i]) == float(top2[0] - top2[1])
    # every logit moved by less than half the margin: no token changes (rows whose margin float32 resolves;
    # an example without one is discarded, and hypothesis fails the test if it finds too few)
    ok = margins > 1e-4
    assume(bool(ok.any()))
    for _ in range(3):
        moved = logits + (torch.rand(n, vocab, generator=gen) * 2 - 1) * (0.45 * margins[:, None])
        assert torch.equal(sample(moved, rows)[0][ok], tokens[ok])
    # negative control: the runner-up raised by more than the margin wins
    scores = torch.where(torch.tensor(temperatures)[:, None] > 0,
                         logits / torch.tensor([t or 1.0 for t in temperatures])[:, None]
                         + gumbel_noise(rows.seeds, rows.positions, vocab).float(), logits)
    runner_up = scores.scatter(1, tokens[:, None], float("-inf")).argmax(-1)
    raised = logits.clone()
    raised[torch.arange(n), runner_up] += 2 * margins + 1e-2
    assert torch.equal(sample(raised, rows)[0], runner_up)


def _generator(*, risk_margin: float, noisy: bool = True, risky_windows: str = "ride") -> DVRGenerator:
    return DVRGenerator(WEIGHTS, CFG, window=WINDOW, group=GROUP, kv_cache_tokens=2048, block_size=8,
                        max_fast_tokens=32, risk_margin=risk_margin,
                        scheduler=DefaultScheduler(risky_windows=risky_windows),
                        fast_policy=NoisyFastPolicy(scale=0.05, seed=3) if noisy else None)


def _case():
    prompts = [[(13 * i + 7 * j) % 200 + 3 for j in range(n)] for i, n in enumerate((9, 12, 6, 11, 7))]
    params = [SamplingParams(max_new_tokens=n, deterministic=det, ignore_eos=True, temperature=t, seed=11 + i,
                             logprobs=det)
              for i, (n, det, t) in enumerate(((30, True, 0.0), (26, True, 0.9), (20, False, 0.0),
                                               (34, True, 0.7), (28, True, 0.0)))]
    return prompts, params


RISK = 1.0  # in logits: a sizeable share of this random model's drafts


def _windows(gen: DVRGenerator) -> list[list[float]]:
    """Per verify window launched: its candidates' margins, as the engine knew them then."""
    def record(work):
        running = gen._pool.running
        return [list(running[w.segment.rid].candidate_margins[: len(w.segment.tokens) - 1])
                for w in work if not w.is_prefill]
    launches = record_launches(gen, record)
    return launches


def _run(gen: DVRGenerator) -> tuple[dict, list[list[float]]]:
    windows = _windows(gen)
    prompts, params = _case()
    out = {c.request_id: (c.token_ids, c.logprobs) for c, sp in zip(serve(gen, prompts, params), params)
           if sp.deterministic}
    return out, [w for launch in windows for w in launch]


@pytest.mark.parametrize("risky_windows", ["ride", "due"])
def test_a_window_ends_at_its_first_risky_draft_and_commits_the_same_bits(risky_windows):
    cut, windows = _run(_generator(risk_margin=RISK, risky_windows=risky_windows))
    # no risky draft before a window's last candidate; and windows did end early at one
    assert all(m >= RISK for w in windows for m in w[:-1])
    ended_early = [w for w in windows if w and w[-1] < RISK and len(w) < WINDOW - 1]
    assert len(ended_early) >= 3, (len(ended_early), len(windows))
    plain, plain_windows = _run(_generator(risk_margin=0.0))
    assert cut == plain  # the cut moves when windows are verified, never a committed bit
    assert any(m < RISK for w in plain_windows for m in w[:-1])  # control: uncut windows hold risky drafts inside
    exact, _ = _run(_generator(risk_margin=RISK, noisy=False))
    assert cut == exact  # and a fast path without noise commits them too


def test_the_check_catches_a_window_that_ignores_the_cut(monkeypatch):
    # negative control: a request whose depth ignores its risky drafts (in what the scheduler sees and in the window
    # launched, which holds no more candidates than the plan counted) builds windows that hold them inside
    monkeypatch.setattr(Request, "_depth_from", lambda self, window, start: self._full_depth(window))
    view = Request.view

    def view_without_the_cut(self, window):
        risky, self.risky = self.risky, []
        try:
            return view(self, window)
        finally:
            self.risky = risky

    monkeypatch.setattr(Request, "view", view_without_the_cut)
    _, windows = _run(_generator(risk_margin=RISK))
    assert any(m < RISK for w in windows for m in w[:-1])


def test_margin_counters_add_up_to_what_the_passes_verified():
    gen = _generator(risk_margin=RISK)
    _run(gen)
    stats = gen.stats
    verified = sum(stats[k] for k in MARGIN_STATS if k.startswith("verified"))
    rejected = sum(stats[k] for k in MARGIN_STATS if k.startswith("rejected"))
    assert stats["rollbacks"] > 0
    assert verified == stats["accepted_tokens"] + stats["rollbacks"]  # each rollback verified one rejected draft
    assert rejected == stats["rollbacks"]
    assert 0 < stats["risky_rollbacks"] <= stats["rollbacks"]
    assert stats["risky_drafts"] > 0


def test_draft_bookkeeping_keeps_margins_beside_their_candidates():
    req = Request(rid=0, prompt=[1, 2, 3], params=SamplingParams(max_new_tokens=100, deterministic=True),
                  seed=0, stop_ids=frozenset(), risk_margin=0.5, num_prefilled=3)
    for token, margin in zip(range(10, 20), (2.0, 3.0, 0.1, 4.0, 5.0, 6.0, 0.2, 7.0, 8.0, 9.0)):
        req.add_candidate(token, margin)
    assert req.risky == [2, 6]
    assert req.window_depth(8) == 3  # up to and including the first risky draft
    assert req._depth_from(8, 3) == 4  # the next window: up to the draft at index 6
    assert req.num_draftable_ahead(8) == 3 + 7 + 1 - 10  # drafting ahead goes on past a risky draft
    assert req._depth_from(8, 7) == 7  # past every risky draft: the full depth
    req.drop_leading_candidates(4)  # a pass committed three candidates and the token after them
    assert req.candidates == [14, 15, 16, 17, 18, 19] and req.candidate_margins[0] == 5.0 and req.risky == [2]
    assert req.window_depth(8) == 3
    req.clear_candidates()
    assert req.candidates == req.candidate_margins == req.risky == []
    assert req.window_depth(8) == 7


@pytest.mark.parametrize("bad,error", [(-0.1, ValueError), (math.nan, ValueError), (math.inf, ValueError),
                                       (True, TypeError), ("0.5", TypeError)])
def test_a_bad_risk_margin_is_refused_naming_it(bad, error):
    with pytest.raises(error, match="risk_margin"):
        DVRGenerator(WEIGHTS, CFG, risk_margin=bad)


def _view(rid: int, *, candidates: int, speculable: int, risky: bool = False) -> RequestView:
    return RequestView(rid, True, 5, 5, 3, candidates, speculable, rid, risky)


def _state(*views: RequestView, **sizes) -> SchedulerState:
    return SchedulerState(requests=views, window=8, group=4, max_fast_tokens=64, step=0, **sizes)


def test_a_risky_window_rides_the_next_pass_or_is_due_as_the_scheduler_says():
    # (oldest first among the windows: the order of service is another test's, tests/test_scheduler_order.py)
    risky, partial = _view(1, candidates=3, speculable=4, risky=True), _view(2, candidates=5, speculable=2)
    # alone, a risky window forms a pass only when it is due ("due"); drafting goes on otherwise
    assert DefaultScheduler(order="arrival").schedule(_state(risky, partial)).verify == ()
    assert DefaultScheduler(order="arrival", risky_windows="due").schedule(_state(risky, partial)).verify[0] == 1
    # a pass formed for a due window: the risky one rides it ahead of the other partial windows
    due = _view(3, candidates=7, speculable=0)
    assert DefaultScheduler(order="arrival").schedule(_state(partial, due, risky)).verify == (3, 1, 2)
    assert DefaultScheduler(order="arrival", risky_windows="off").schedule(_state(partial, due, risky)).verify == (3, 2, 1)
    # and beyond the rows its due windows leave in their blocks of R (here none: four due windows fill R = 32)
    full = [_view(10 + i, candidates=7, speculable=0) for i in range(4)]
    wide = dict(max_canonical_tokens=64, max_canonical_results=64)
    # (the risky window opens a second block of R, whose free rows then take the partial window too)
    assert DefaultScheduler(order="arrival").schedule(_state(partial, *full, risky, **wide)).verify == (10, 11, 12, 13, 1, 2)
    assert DefaultScheduler(order="arrival", risky_windows="off").schedule(_state(partial, *full, risky, **wide)).verify == (
        10, 11, 12, 13)


def test_a_bad_risky_windows_is_refused_naming_it():
    with pytest.raises(ValueError, match="risky_windows"):
        DefaultScheduler(risky_windows="now")
