"""``split_pass_steps=True``: a step that applies a canonical pass's commits launches no pass (the next step does).

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
