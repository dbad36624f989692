"""``split_pass_steps=True``: a step that applies a canonical pass's commits launches no pass (the next step does);
``pass_before_read=True``: a pass goes out before the previous fast step is read back.

Passes run on the CPU's worker thread (``canonical_thread``), slowed so that fast steps run while one is in
flight and a pass is applied at the top of a later step. With the option, no step applies a pass and then
launches one while a fast step is in flight (a step with nothing else to run launches at once: nothing waits on
it); without it (the negative control) some step does, so the property is not vacuous. Committed
deterministic output is the same with and without it, and equal to each request run alone.
"""

from __future__ import annotations

import pytest

from llm42 import DVRGenerator
from tests.test_canonical_thread import CFG, WEIGHTS, SlowCanonicalPolicy, _requests
from llm42.policies import NoisyFastPolicy


def _generator(*, split: bool) -> DVRGenerator:
    return DVRGenerator(WEIGHTS, CFG, window=4, group=2, kv_cache_tokens=4096, max_fast_tokens=64,
                        canonical_policy=SlowCanonicalPolicy(), fast_policy=NoisyFastPolicy(scale=2.0, seed=3),
                        canonical_thread=True, split_pass_steps=split)


def _run_logging_phases(gen: DVRGenerator, prompts, params) -> tuple[list, list[list[str]]]:
    """Step until done; per step, the order in which it applied ("apply") and launched passes ("launch" with a
    fast step in flight, "launch alone" without)."""
    steps: list[list[str]] = []
    finish, launch = gen._finish_canonical, gen._launch_canonical

    def logged_finish(events):
        steps[-1].append("apply")
        return finish(events)

    def logged_launch(plan, windows):
        steps[-1].append("launch" if gen.fast_step.in_flight is not None else "launch alone")
        return launch(plan, windows)

    gen._finish_canonical, gen._launch_canonical = logged_finish, logged_launch
    rids = [gen.submit(p, s) for p, s in zip(prompts, params)]
    while gen.has_unfinished():
        steps.append([])
        gen.step()
    return [gen.result(rid) for rid in rids], steps


def _applies_then_launches(phases: list[str]) -> bool:
    return "apply" in phases and "launch" in phases[phases.index("apply"):]


@pytest.mark.parametrize("seed", [0, 1])
def test_no_step_applies_a_pass_and_then_launches_one(seed):
    prompts, params = _requests(seed, 12)
    split_gen, plain_gen = _generator(split=True), _generator(split=False)
    split, split_steps = _run_logging_phases(split_gen, prompts, params)
    plain, plain_steps = _run_logging_phases(plain_gen, prompts, params)
    # the negative control: without the option, passes are applied and launched in one step
    assert any(_applies_then_launches(s) for s in plain_steps), "no step applied then launched: proves nothing"
    assert plain_gen.stats["split_passes"] == 0
    assert not [i for i, s in enumerate(split_steps) if _applies_then_launches(s)]
    assert split_gen.stats["split_passes"] > 0
    assert split_gen.stats["rollbacks"] > 0  # the noisy fast path forced rollbacks
    alone = DVRGenerator(WEIGHTS, CFG, window=4, group=2, kv_cache_tokens=4096, max_fast_tokens=64)
    num_det = 0
    for prompt, p, a, b in zip(prompts, params, split, plain):
        if p.deterministic:
            num_det += 1
            ref = alone.generate([prompt], p)[0]
            assert (a.token_ids, a.logprobs) == (b.token_ids, b.logprobs) == (ref.token_ids, ref.logprobs)
    assert num_det >= 6


def test_split_pass_steps_is_a_strict_bool():
    with pytest.raises(TypeError, match="split_pass_steps"):
        DVRGenerator(WEIGHTS, CFG, window=4, group=2, kv_cache_tokens=4096, split_pass_steps=1)


def _run_logging_order(gen: DVRGenerator, prompts, params) -> tuple[list, list[list[str]]]:
    """Step until done; per step, the order of its reads of a fast step ("read") and pass launches ("launch")."""
    steps: list[list[str]] = []
    read, launch = gen.fast_step.read, gen._launch_canonical

    def logged_read(*args, **kwargs):
        steps[-1].append("read")
        return read(*args, **kwargs)

    def logged_launch(plan, windows):
        steps[-1].append("launch")
        return launch(plan, windows)

    gen.fast_step.read, gen._launch_canonical = logged_read, logged_launch
    rids = [gen.submit(p, s) for p, s in zip(prompts, params)]
    while gen.has_unfinished():
        steps.append([])
        gen.step()
    return [gen.result(rid) for rid in rids], steps


@pytest.mark.parametrize("thread", [False, True])
def test_pass_before_read_launches_before_the_read_back_and_commits_the_same(thread):
    """``pass_before_read=True``: a step whose pass needs no wait launches it before reading the previous fast step
    back; without it (the negative control) every launch comes after that read. Same committed bits either way, with
    passes inline and on the worker thread, with rollbacks forced."""
    prompts, params = _requests(3, 12)

    def build(early: bool) -> DVRGenerator:
        return DVRGenerator(WEIGHTS, CFG, window=4, group=2, kv_cache_tokens=4096, max_fast_tokens=64,
                            canonical_policy=SlowCanonicalPolicy() if thread else None,
                            fast_policy=NoisyFastPolicy(scale=2.0, seed=3), canonical_thread=thread,
                            pass_before_read=early)

    early_gen = build(True)
    early, early_steps = _run_logging_order(early_gen, prompts, params)
    late, late_steps = _run_logging_order(build(False), prompts, params)
    assert early_gen.stats["rollbacks"] > 0
    launched_early = [s for s in early_steps if "launch" in s and "read" in s and s.index("launch") < s.index("read")]
    assert launched_early, "no pass went out before the read: the option did nothing"
    assert not [s for s in late_steps if "launch" in s and "read" in s and s.index("launch") < s.index("read")]
    assert any("launch" in s and "read" in s for s in late_steps)  # the control has steps to compare
    alone = DVRGenerator(WEIGHTS, CFG, window=4, group=2, kv_cache_tokens=4096, max_fast_tokens=64)
    num_det = 0
    for prompt, p, a, b in zip(prompts, params, early, late):
        if p.deterministic:
            num_det += 1
            ref = alone.generate([prompt], p)[0]
            assert (a.token_ids, a.logprobs) == (b.token_ids, b.logprobs) == (ref.token_ids, ref.logprobs)
        else:
            assert a.finish_reason is not None and b.finish_reason is not None
    assert num_det >= 6


def test_pass_before_read_is_a_strict_bool():
    with pytest.raises(TypeError, match="pass_before_read"):
        DVRGenerator(WEIGHTS, CFG, window=4, group=2, kv_cache_tokens=4096, pass_before_read="yes")
