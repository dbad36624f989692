"""Committing a window's tokens in one go (``RequestPool.commit_tokens``) decides stops as appending them one by
one does: up to and including the first stop token, else up to ``max_new_tokens``, "stop" winning where both
fall on one token. And the prefix index reads a commit's prompt + outputs through a view (``_Joined``) that
slices like the concatenated list.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from llm42 import SamplingParams
from llm42.engine.requests import Request, RequestPool, _Joined

STOPS = frozenset({2, 9})


def _request(num_done: int, max_new: int) -> Request:
    req = Request(rid=0, prompt=[5, 6], params=SamplingParams(max_new_tokens=max_new), seed=0, stop_ids=STOPS)
    req.token_ids = [7] * num_done
    req.logprobs = [-1.0] * num_done
    return req


def _one_by_one(req: Request, tokens, logprobs, *, stop_first: bool = True):
    """The per-token rule (round 22's loop); ``stop_first=False`` checks the length first (a wrong rule)."""
    accepted = []
    for token, logprob in zip(tokens, logprobs):
        req.token_ids.append(token)
        req.logprobs.append(logprob)
        accepted.append(token)
        checks = [("stop", token in req.stop_ids), ("length", len(req.token_ids) >= req.max_new_tokens)]
        reason = next((name for name, hit in (checks if stop_first else checks[::-1]) if hit), None)
        if reason:
            req.finish_reason = reason
            break
    return accepted


@settings(max_examples=200, deadline=None)
@given(num_done=st.integers(0, 6), extra=st.integers(1, 6), tokens=st.lists(st.integers(0, 12), max_size=8))
def test_a_commit_in_one_go_finishes_as_one_by_one(num_done, extra, tokens):
    max_new = num_done + extra
    logprobs = [-0.5 - i for i in range(len(tokens))]
    pool = RequestPool(max_num_seqs=1, window=4, adaptive_draft=False)
    got, events = _request(num_done, max_new), {}
    finished = pool.commit_tokens(got, list(tokens), list(logprobs), events)
    want = _request(num_done, max_new)
    accepted = _one_by_one(want, tokens, logprobs)
    assert (got.token_ids, got.logprobs, got.finish_reason) == (want.token_ids, want.logprobs, want.finish_reason)
    assert finished == (want.finish_reason is not None) and events.get(0, []) == accepted
    assert pool.stats["committed_tokens"] == len(accepted)


def test_a_stop_token_that_is_also_the_last_allowed_finishes_as_stop():
    """Negative control: the rule with the length checked first calls this token's finish "length"."""
    pool = RequestPool(max_num_seqs=1, window=4, adaptive_draft=False)
    got = _request(2, 4)
    pool.commit_tokens(got, [3, 9, 4], [-1.0, -1.0, -1.0], {})
    assert got.finish_reason == "stop" and got.token_ids[-1] == 9
    wrong = _request(2, 4)
    _one_by_one(wrong, [3, 9, 4], [-1.0, -1.0, -1.0], stop_first=False)
    assert wrong.finish_reason == "length"


@given(parts=st.lists(st.lists(st.integers(0, 50), max_size=7), max_size=4), start=st.integers(-3, 25),
       stop=st.integers(-3, 25))
def test_a_joined_view_slices_and_indexes_like_the_concatenation(parts, start, stop):
    joined, flat = _Joined(*parts), [t for p in parts for t in p]
    assert len(joined) == len(flat) and list(joined) == flat
    assert joined[start:stop] == flat[start:stop]
    if flat:
        assert joined[start % len(flat)] == flat[start % len(flat)] and joined[-1] == flat[-1]
