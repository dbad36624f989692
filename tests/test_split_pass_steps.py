"""``split_pass_steps=True``: a step that applies a canonical pass's commits launches no pass (the next step does);
``pass_before_read=True``: a pass goes out before the previous fast step is read back; ``apply_before_read=True``: a
pass that finished by the fast step's launch is applied before that read.

Passes run on the CPU's worker thread (``canonical_thread``), slowed so that fast steps run while one is in
flight and a pass is applied at the top of a later step. With the option, no step applies a pass and then
launches one while a fast step is in flight (a step with nothing else to run launches at once: nothing waits on
it); without it (the negative control) some step does, so the property is not vacuous. Committed
deterministic output is the same with and without it, and equal to each request run alone.
"""

from __future__ import annotations

import pytest

from llm42 import DVRGenerator
from tests.helpers import applies_between_launch_and_read
from tests.test_canonical_thread import CFG, WEIGHTS, SlowCanonicalPolicy, _requests
from llm42.policies import NoisyFastPolicy


def _generator(*, split: bool) -> DVRGenerator:
    return DVRGenerator(WEIGHTS, CFG, window=4, group=2, kv_cache_tokens=4096, max_fast_tokens=64,
                        canonical_policy=SlowCanonicalPolicy(), fast_policy=NoisyFastPolicy(scale=2.0, seed=3),
                        canonical_thread=True, split_pass_steps=split)


def _run_logging(gen: DVRGenerator, prompts, params, *, read: bool = False,
                 fast: bool = False) -> tuple[list, list[list[str]]]:
    """Step until done; per step, in order, the passes it applied ("apply") and launched ("launch" with a fast step
    in flight, "launch alone" without), with ``read`` its read-backs of a fast step ("read") and with ``fast`` its
    fast steps' launches ("fast")."""
    steps: list[list[str]] = []

    def logged(owner, name: str, label):
        original = getattr(owner, name)

        def call(*args, **kwargs):
            steps[-1].append(label())
            return original(*args, **kwargs)

        setattr(owner, name, call)

    logged(gen.passes, "apply_oldest", lambda: "apply")
    logged(gen.passes, "launch", lambda: "launch" if gen.fast_step.in_flight is not None else "launch alone")
    if read:
        logged(gen.fast_step, "read", lambda: "read")
    if fast:
        logged(gen.fast_step, "launch", lambda: "fast")
    rids = [gen.submit(p, s) for p, s in zip(prompts, params)]
    while gen.has_unfinished():
        steps.append([])
        gen.step()
    return [gen.result(rid) for rid in rids], steps


def assert_alone_bits(prompts, params, *runs, alone: DVRGenerator) -> None:
    """Every run's deterministic requests commit the tokens and log-probs ``alone`` gives each run by itself (at
    least 6 of them); the free ones finished."""
    num_det = 0
    for prompt, p, *got in zip(prompts, params, *runs):
        if p.deterministic:
            num_det += 1
            ref = alone.generate([prompt], p)[0]
            for c in got:
                assert (c.token_ids, c.logprobs) == (ref.token_ids, ref.logprobs)
        else:
            assert all(c.finish_reason is not None for c in got)
    assert num_det >= 6


def _alone() -> DVRGenerator:
    return DVRGenerator(WEIGHTS, CFG, window=4, group=2, kv_cache_tokens=4096, max_fast_tokens=64)


def _launches_before_read(phases: list[str]) -> bool:
    launches = [i for i, x in enumerate(phases) if x.startswith("launch")]
    return bool(launches) and "read" in phases and launches[0] < phases.index("read")


def _applies_then_launches(phases: list[str]) -> bool:
    return "apply" in phases and "launch" in phases[phases.index("apply"):]


@pytest.mark.parametrize("seed", [0, 1])
def test_no_step_applies_a_pass_and_then_launches_one(seed):
    prompts, params = _requests(seed, 12)
    split_gen, plain_gen = _generator(split=True), _generator(split=False)
    split, split_steps = _run_logging(split_gen, prompts, params)
    plain, plain_steps = _run_logging(plain_gen, prompts, params)
    # the negative control: without the option, passes are applied and launched in one step
    assert any(_applies_then_launches(s) for s in plain_steps), "no step applied then launched: proves nothing"
    assert plain_gen.stats["split_passes"] == 0
    assert not [i for i, s in enumerate(split_steps) if _applies_then_launches(s)]
    assert split_gen.stats["split_passes"] > 0
    assert split_gen.stats["rollbacks"] > 0  # the noisy fast path forced rollbacks
    assert_alone_bits(prompts, params, split, plain, alone=_alone())


def test_split_pass_steps_is_a_strict_bool():
    with pytest.raises(TypeError, match="split_pass_steps"):
        DVRGenerator(WEIGHTS, CFG, window=4, group=2, kv_cache_tokens=4096, split_pass_steps=1)


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
    early, early_steps = _run_logging(early_gen, prompts, params, read=True)
    late, late_steps = _run_logging(build(False), prompts, params, read=True)
    assert early_gen.stats["rollbacks"] > 0
    assert any(_launches_before_read(s) for s in early_steps), "no pass went out before the read: the option did nothing"
    assert not any(_launches_before_read(s) for s in late_steps)
    assert any("launch" in s and "read" in s for s in late_steps)  # the control has steps to compare
    assert_alone_bits(prompts, params, early, late, alone=_alone())


def test_pass_before_read_is_a_strict_bool():
    with pytest.raises(TypeError, match="pass_before_read"):
        DVRGenerator(WEIGHTS, CFG, window=4, group=2, kv_cache_tokens=4096, pass_before_read="yes")


@pytest.mark.parametrize("early_launch", [False, True])
def test_apply_before_read_applies_under_the_read_and_commits_the_same(early_launch):
    """``apply_before_read=True``: some step applies a pass that finished by its fast step's launch before reading
    the previous fast step back (the fast step just launched drafted from the state before the apply); without it
    (the negative control) no step applies a pass between the two. Passes on the worker thread, slowed so that they
    are in flight across steps, rollbacks forced: the same committed bits either way, and each deterministic request
    alone's; alone and with ``pass_before_read``."""
    prompts, params = _requests(5, 12)

    def build(option: bool) -> DVRGenerator:
        return DVRGenerator(WEIGHTS, CFG, window=4, group=2, kv_cache_tokens=4096, max_fast_tokens=64,
                            canonical_policy=SlowCanonicalPolicy(), fast_policy=NoisyFastPolicy(scale=2.0, seed=3),
                            canonical_thread=True, apply_before_read=option, pass_before_read=early_launch)

    gen = build(True)
    got, steps = _run_logging(gen, prompts, params, read=True, fast=True)
    control, control_steps = _run_logging(build(False), prompts, params, read=True, fast=True)
    assert gen.stats["rollbacks"] > 0
    assert any(applies_between_launch_and_read(s) for s in steps), "no pass applied before the read: vacuous"
    assert not any(applies_between_launch_and_read(s) for s in control_steps)
    assert any("apply" in s and "read" in s for s in control_steps)  # the control applies passes too
    assert_alone_bits(prompts, params, got, control, alone=_alone())


def test_apply_before_read_is_a_strict_bool():
    with pytest.raises(TypeError, match="apply_before_read"):
        DVRGenerator(WEIGHTS, CFG, window=4, group=2, kv_cache_tokens=4096, apply_before_read=1)
