"""``DVRGenerator.step(deliver=...)``: the tokens read back before a step's canonical phase are handed over then.

On the CPU the canonical passes run on the worker thread (``canonical_thread``), slowed so that passes are applied
and launched in steps that also read a fast step back: the steps whose free gaps were the longest online (round
36). Checked: every committed token reaches the caller exactly once (through ``deliver`` or the returned dict), in
commit order, and the committed output is what the same run gives without ``deliver``; some step handed free
tokens over before it launched or applied a pass (so "early" is not vacuous); a ``deliver`` that raises leaves its
tokens for the next step (the negative control of "exactly once": the same tokens then arrive twice to a caller
that kept the first copy); ``AsyncEngine`` streams through it. A property over drawn mixes, engine knobs and
arrivals checks "once" and the committed output again (its examples with a free request must hand tokens over).
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from llm42 import DVRGenerator
from llm42.testing import strategies as ls
from llm42.async_engine import AsyncEngine
from tests.test_canonical_thread import CFG, WEIGHTS, SlowCanonicalPolicy, _requests
from llm42.policies import NoisyFastPolicy


def _generator() -> DVRGenerator:
    return DVRGenerator(WEIGHTS, CFG, window=4, group=2, kv_cache_tokens=4096, max_fast_tokens=64,
                        canonical_policy=SlowCanonicalPolicy(), fast_policy=NoisyFastPolicy(scale=2.0, seed=3),
                        canonical_thread=True)


def _serve(gen: DVRGenerator, prompts, params, *, early: bool):
    """Step until done; the tokens each request got (in arrival order), and per step what was handed over early:
    (free tokens handed over, passes launched and applied in the step after that hand-over)."""
    rids = [gen.submit(p, s) for p, s in zip(prompts, params)]
    is_free = {rid: not s.deterministic for rid, s in zip(rids, params)}
    got: dict[int, list[int]] = {rid: [] for rid in rids}
    steps: list[tuple[int, int]] = []
    while gen.has_unfinished():
        mark: dict = {}

        def deliver(events):
            assert not mark, "deliver is called once a step"
            mark["free"] = sum(len(t) for rid, t in events.items() if is_free[rid])
            mark["passes"] = gen.stats["canonical_passes"]
            mark["committed"] = gen.stats["committed_tokens"]
            for rid, tokens in events.items():
                got[rid] += tokens

        events = gen.step(deliver=deliver) if early else gen.step()
        for rid, tokens in events.items():
            got[rid] += tokens
        if mark:
            # after the hand-over only passes commit (deterministic tokens) and launch
            later = (gen.stats["canonical_passes"] - mark["passes"]
                     + (gen.stats["committed_tokens"] - mark["committed"]))
            steps.append((mark["free"], later))
    return [gen.result(rid) for rid in rids], got, rids, steps


@pytest.mark.parametrize("seed", [0, 1])
def test_deliver_hands_each_token_over_once_before_the_canonical_phase(seed):
    prompts, params = _requests(seed, 12)
    early, got, rids, steps = _serve(_generator(), prompts, params, early=True)
    plain, plain_got, plain_rids, _ = _serve(_generator(), prompts, params, early=False)
    for c, rid in zip(early, rids):
        assert got[rid] == c.token_ids  # each committed token once, in order
    for c, p in zip(plain, plain_rids):
        assert plain_got[p] == c.token_ids
    for a, b, s in zip(early, plain, params):
        if s.deterministic:
            assert (a.token_ids, a.logprobs) == (b.token_ids, b.logprobs)
    # some step handed free tokens over and only then launched or applied a pass: not vacuous
    assert any(free and later for free, later in steps)


def test_a_deliver_that_raises_leaves_its_tokens_for_the_next_step():
    prompts, params = _requests(2, 6)
    gen = _generator()
    rids = [gen.submit(p, s) for p, s in zip(prompts, params)]
    kept: dict[int, list[int]] = {rid: [] for rid in rids}
    failed: dict[int, tuple[int, int]] = {}  # rid -> (where the failed hand-over's tokens went in kept, how many)
    calls = {"n": 0}

    def failing(events):
        calls["n"] += 1
        for rid, tokens in events.items():
            if calls["n"] == 3:
                failed[rid] = (len(kept[rid]), len(tokens))
            kept[rid] += tokens  # a caller that kept them before failing
        if calls["n"] == 3:
            raise RuntimeError("injected")

    raised = 0
    while gen.has_unfinished():
        try:
            events = gen.step(deliver=failing)
        except RuntimeError:
            raised += 1
            continue
        for rid, tokens in events.items():
            kept[rid] += tokens
    assert raised == 1 and failed
    results = dict(zip(rids, (gen.result(rid) for rid in rids)))
    # the failed hand-over's tokens came again with a later step: a caller that kept the first copy holds them
    # twice (the negative control of the exactly-once check above); without that copy, every output is whole
    for rid in rids:
        tokens = kept[rid]
        if rid in failed:
            at, n = failed[rid]
            assert tokens != results[rid].token_ids
            tokens = tokens[:at] + tokens[at + n:]
        assert tokens == results[rid].token_ids


def test_async_engine_streams_tokens_handed_over_mid_step():
    prompts, params = _requests(3, 8)
    gen = _generator()
    calls = {"deliver": 0}
    step = gen.step

    def spying(deliver=None):
        if deliver is not None:
            calls["deliver"] += 1
        return step(deliver=deliver)

    gen.step = spying
    reference = _generator().generate(prompts, params)

    async def run():
        streams = [engine.submit(p, s) for p, s in zip(prompts, params)]
        return [await s.result() for s in streams]

    with AsyncEngine(gen) as engine:
        got = asyncio.run(run())
    assert calls["deliver"] > 0
    for a, b, s in zip(got, reference, params):
        if s.deterministic:
            assert (a.token_ids, a.logprobs) == (b.token_ids, b.logprobs)
        else:
            assert a.finish_reason is not None


@settings(max_examples=12)
@given(mix=ls.batch_mixes(vocab_size=CFG.vocab_size, min_size=2, max_size=6, logprobs=True),
       knobs=ls.engine_knobs(num_canonical_rows=8), noisy=st.booleans(), stride=st.integers(0, 2))
def test_deliver_keeps_every_token_once_whatever_the_knobs(mix, knobs, noisy, stride):
    """Drawn mixes, engine knobs (those that never change a committed bit), a plain or noisy fast path, arrivals
    every ``stride`` steps: stepped with ``deliver``, each request's tokens (handed over and returned) are its
    Completion's, and deterministic requests commit what the same generator commits stepped without it."""
    def make():
        return DVRGenerator(WEIGHTS, CFG, window=4, group=2, kv_cache_tokens=4096,
                            fast_policy=NoisyFastPolicy(scale=2.0, seed=3) if noisy else None,
                            **{k: v for k, v in knobs.items() if k != "scheduler"})

    def serve(early: bool):
        gen = make()
        got: dict[int, list[int]] = {}
        rids: list[int] = []

        def take(events):
            for rid, tokens in events.items():
                got.setdefault(rid, []).extend(tokens)

        def handed(events):
            handed_over[0] += sum(map(len, events.values()))
            take(events)

        pending = list(mix)
        while pending or gen.has_unfinished():
            for _ in range(1 if stride else len(pending)):
                if pending:
                    rids.append(gen.submit(*pending.pop(0)))
            for _ in range(max(stride, 1)):
                if gen.has_unfinished():
                    take(gen.step(deliver=handed) if early else gen.step())
        return [gen.result(rid) for rid in rids], [got.get(rid, []) for rid in rids]

    handed_over = [0]
    early, early_got = serve(True)
    # the examples with a free request hand tokens over mid-step (each free token is read back)
    if any(not p.deterministic for _, p in mix):
        assert handed_over[0] > 0
    event(f"tokens handed over mid-step: {'some' if handed_over[0] else 'none'}")
    plain, plain_got = serve(False)
    for c, tokens in zip(early, early_got):
        assert tokens == c.token_ids
    for c, tokens in zip(plain, plain_got):
        assert tokens == c.token_ids
    for (_, p), a, b in zip(mix, early, plain):
        if p.deterministic:
            assert (a.token_ids, a.logprobs) == (b.token_ids, b.logprobs)
