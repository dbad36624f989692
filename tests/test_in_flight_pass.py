"""A canonical pass still running on the device when the host has nothing else to launch.

On CUDA a pass runs on its own stream and ``step()`` applies it once its event has
completed. When every running request is inside that pass (or waits on what it
commits), the step must wait for the pass rather than return an empty step that the
caller spins on. On the CPU a pass is finished when ``launch`` returns, so the test
wraps the verifier's launch to report "not ready" until ``finish`` waits for it.
"""

from __future__ import annotations

import pytest

from llm42 import DVRGenerator, SamplingParams
from llm42.model.weights import random_weights
from llm42.verify.verifier import LaunchedPass
from tests.helpers import tiny_config

CFG = tiny_config(max_position_embeddings=128)
WEIGHTS = random_weights(CFG, seed=5)
PARAMS = SamplingParams(max_new_tokens=12, deterministic=True, ignore_eos=True)


class _NotReadyUntilWaited:
    """A pass result that never says it is ready; ``wait`` (what ``finish`` calls) still returns it."""

    def __init__(self, result):
        self._result = result

    def is_ready(self) -> bool:
        return False

    def __getattr__(self, name):
        return getattr(self._result, name)


def _generator(*, is_slow_device: bool) -> DVRGenerator:
    gen = DVRGenerator(WEIGHTS, CFG, window=4, group=2, kv_cache_tokens=256, block_size=8)
    if is_slow_device:
        launch = gen.verifier.launch
        gen.verifier.launch = lambda work, kv: (lambda p: LaunchedPass(p.work, _NotReadyUntilWaited(p.result)))(
            launch(work, kv))
    return gen


def _run(gen: DVRGenerator, prompts, *, max_steps: int) -> tuple[dict[int, list[int]], int, int]:
    rids = [gen.submit(p, PARAMS) for p in prompts]
    committed = {rid: [] for rid in rids}
    num_steps = num_empty = 0
    while gen.has_unfinished():
        if num_steps == max_steps:
            pytest.fail(f"{max_steps} steps and still unfinished ({num_empty} returned nothing): the loop spins")
        events = gen.step()
        num_steps += 1
        num_empty += not events
        for rid, tokens in events.items():
            committed[rid] += tokens
    return committed, num_steps, num_empty


@pytest.mark.parametrize("num_requests", [1, 3])
def test_a_step_with_nothing_to_launch_waits_for_the_pass_in_flight(num_requests):
    prompts = [[1, 5 + i, 9, 13 + i] for i in range(num_requests)]
    reference, reference_steps, _ = _run(_generator(is_slow_device=False), prompts, max_steps=200)
    assert [len(t) for t in reference.values()] == [PARAMS.max_new_tokens] * num_requests  # not vacuous
    # while a pass is out, fast steps may still run ahead (drafts), so the step count differs; what must not
    # happen is a step with nothing to launch returning empty, which here would repeat forever
    committed, _, _ = _run(_generator(is_slow_device=True), prompts, max_steps=4 * reference_steps)
    assert list(committed.values()) == list(reference.values())  # the same committed tokens
