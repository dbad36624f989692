"""``CanonicalPasses`` (``llm42.engine.passes``): the verbs of a step's canonical phase, on a pass held in flight.

The verifier's passes are wrapped so that one reports "not ready" (and ``wait_ready`` times out) while the test holds
it; its work is computed at launch, as a device queues it. Properties: ``wait_briefly`` applies the oldest pass only
once it has finished (held, it stays in flight and nothing is committed: the negative control); ``drain`` applies
every pass in flight; applying a pass commits what it verified (the held requests' committed tokens grow by exactly
the events reported); and a run whose passes were held and drained by hand commits what an undisturbed run does.
"""

from __future__ import annotations

import pytest

from llm42 import DVRGenerator, SamplingParams
from tests.helpers import wrap_pass_results
from tests.test_canonical_thread import CFG, WEIGHTS


class _HeldResult:
    """A pass result that is not ready, and whose ``wait_ready`` times out, while ``holding["on"]``."""

    def __init__(self, result, holding: dict):
        self._result, self._holding = result, holding

    def is_ready(self) -> bool:
        return not self._holding["on"] and self._result.is_ready()

    def wait_ready(self, timeout_s: float) -> bool:
        return not self._holding["on"]

    def __getattr__(self, name):
        return getattr(self._result, name)


def _generator(holding: dict | None = None) -> DVRGenerator:
    gen = DVRGenerator(WEIGHTS, CFG, window=4, group=2, kv_cache_tokens=4096, max_fast_tokens=64)
    if holding is not None:
        wrap_pass_results(gen, lambda result: _HeldResult(result, holding))
    return gen


PROMPTS = [[1, 5, 9, 14, 3], [1, 22, 7], [1, 40, 41, 42, 43, 44, 45]]
PARAMS = [SamplingParams(max_new_tokens=12, deterministic=True, temperature=0.8, seed=i, logprobs=True)
          for i in range(len(PROMPTS))]


def _step_until_held(gen: DVRGenerator, holding: dict) -> None:
    """Step (passes released) until a step ends with a pass in flight; then hold it."""
    for _ in range(200):
        holding["on"] = True
        gen.step()
        if gen.passes.oldest is not None:
            return
    pytest.fail("no step ended with a canonical pass in flight")


def _committed(gen: DVRGenerator, rids) -> dict[int, list[int]]:
    return {rid: gen.committed_tokens(rid) for rid in rids}


def test_wait_briefly_applies_a_pass_only_once_it_has_finished():
    holding = {"on": False}
    gen = _generator(holding)
    rids = [gen.submit(p, q) for p, q in zip(PROMPTS, PARAMS)]
    _step_until_held(gen, holding)
    passes, launched = gen.passes, gen.passes.oldest
    assert passes.num_in_flight == 1
    before, events = _committed(gen, rids), {}
    passes.wait_briefly(events, 0.01)
    assert passes.oldest is launched and events == {} and _committed(gen, rids) == before  # held: not applied
    holding["on"] = False
    passes.wait_briefly(events, 0.01)
    assert passes.oldest is None and passes.num_in_flight == 0
    assert events, "the pass committed nothing"
    after = _committed(gen, rids)
    for rid in rids:
        assert after[rid] == before[rid] + events.get(rid, [])
    gen.close()


def test_drain_applies_every_pass_and_the_run_commits_what_an_undisturbed_one_does():
    reference = _generator().generate(PROMPTS, PARAMS)
    holding = {"on": False}
    gen = _generator(holding)
    rids = [gen.submit(p, q) for p, q in zip(PROMPTS, PARAMS)]
    num_drained = 0
    while gen.has_unfinished():
        holding["on"] = True
        gen.step()
        if gen.passes.oldest is not None:
            holding["on"] = False
            events = {}
            before = _committed(gen, rids)
            gen.passes.drain(events)
            num_drained += 1
            assert gen.passes.num_in_flight == 0
            for rid in rids:
                assert gen.committed_tokens(rid) == before[rid] + events.get(rid, [])
    assert num_drained > 0
    got = [gen.result(rid) for rid in rids]
    assert [(c.token_ids, c.logprobs) for c in got] == [(c.token_ids, c.logprobs) for c in reference]
