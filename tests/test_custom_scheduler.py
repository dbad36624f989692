"""The example user scheduler (examples/custom_scheduler.py) keeps the engine's contract.

Its plans must pass ``validate_plan``, it must defer verification only under
load and only for a bounded number of steps, and — the contract — deterministic
requests run under it (with a noisy fast path and drawn arrivals) must equal
their batch-size-1 reference from the default scheduler, bit for bit.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm42 import DVRGenerator, Plan, RequestView, SamplingParams, SchedulerState
from llm42.model.weights import random_weights
from llm42.policies import NoisyFastPolicy
from llm42.scheduler import validate_plan
from llm42.testing import assert_matches_reference, run_schedule
from llm42.testing import strategies as ls

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "custom_scheduler.py"



@pytest.fixture(scope="module")
def priority_scheduler():
    spec = importlib.util.spec_from_file_location("llm42_example_custom_scheduler", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.PriorityScheduler


@pytest.fixture(scope="module")
def wide():
    # hidden 512 fp32: CPU GEMMs drift with the batch size, so agreement is not free
    cfg = ls.wide_model_config(vocab_size=256, max_position_embeddings=64)
    return random_weights(cfg, seed=7), cfg


def _view(rid: int, *, deterministic: bool, due: bool = False, prefill: bool = False, arrival: int = 0,
          window: int = 4) -> RequestView:
    num_candidates = window - 1 if due else 0
    return RequestView(
        rid=rid, is_deterministic=deterministic, num_prompt_tokens=5, num_prefilled=0 if prefill else 5,
        num_generated=1, num_candidates=num_candidates,
        num_speculable=(0 if due else window - 1) if deterministic else 0, arrival=arrival,
    )


def _state(views, step: int, *, window: int = 4, group: int = 2) -> SchedulerState:
    return SchedulerState(tuple(views), window, group, max_fast_tokens=64, step=step)


def test_under_load_a_due_window_waits_at_most_max_deferral_steps(priority_scheduler):
    scheduler = priority_scheduler(busy_threshold=3, max_deferral=2)
    views = [_view(0, deterministic=True, due=True)] + [_view(r, deterministic=False, arrival=r) for r in (1, 2, 3)]
    plans = []
    for step in range(3):
        state = _state(views, step)
        plan = scheduler.schedule(state)
        validate_plan(plan, state)
        plans.append(plan)
    assert [p.verify for p in plans] == [(), (), (0,)]
    assert all(p.fast_decode == (1, 2, 3) for p in plans)  # free traffic never waits


def test_a_full_group_of_due_windows_is_verified_at_once_even_under_load(priority_scheduler):
    scheduler = priority_scheduler(busy_threshold=1, max_deferral=10)
    views = [_view(0, deterministic=True, due=True), _view(1, deterministic=True, due=True, arrival=1),
             _view(2, deterministic=False, arrival=2)]
    state = _state(views, 0, group=2)
    plan = scheduler.schedule(state)
    validate_plan(plan, state)
    assert plan.verify == (0, 1) and plan.fast_decode == (2,)


def test_off_load_verification_is_immediate(priority_scheduler):
    scheduler = priority_scheduler(busy_threshold=4, max_deferral=10)
    views = [_view(0, deterministic=True, due=True), _view(1, deterministic=False, arrival=1),
             _view(2, deterministic=True, prefill=True, arrival=2)]
    state = _state(views, 0)
    plan = scheduler.schedule(state)
    validate_plan(plan, state)
    assert plan.verify == (0,)
    assert [c.rid for c in plan.canonical_prefill] == [2]


def test_plan_is_never_empty_while_requests_wait(priority_scheduler):
    # under load by threshold 0, but nothing but a due window can run: verify rather than stall
    scheduler = priority_scheduler(busy_threshold=0, max_deferral=100)
    state = _state([_view(0, deterministic=True, due=True)], 0)
    plan = scheduler.schedule(state)
    validate_plan(plan, state)
    assert plan == Plan(verify=(0,))


def test_bad_arguments_raise_value_error(priority_scheduler):
    with pytest.raises(ValueError, match="max_deferral"):
        priority_scheduler(max_deferral=-1)
    with pytest.raises(ValueError, match="busy_threshold"):
        priority_scheduler(busy_threshold=1.5)


def test_no_deterministic_request_waits_beyond_the_bound(priority_scheduler, wide):
    weights, cfg = wide
    max_deferral, window, group = 2, 4, 2

    class Recording(priority_scheduler):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.history: list[tuple[SchedulerState, Plan]] = []

        def schedule(self, state):
            plan = super().schedule(state)
            self.history.append((state, plan))
            return plan

    scheduler = Recording(busy_threshold=2, max_deferral=max_deferral)
    gen = DVRGenerator(weights, cfg, window=window, group=group, scheduler=scheduler,
                       fast_policy=NoisyFastPolicy(scale=1.0, seed=3))
    det = SamplingParams(max_new_tokens=10, deterministic=True)
    free = SamplingParams(max_new_tokens=20, temperature=1.0, seed=1)
    prompts = [[3, 4, 5, 6], [7, 8], [9] * 6, [10, 11], [12, 13, 14], [15]]
    params = [det, free, det, free, det, free]
    run_schedule(gen, prompts, params, [0, 0, 1, 0, 2, 0])

    num_det = sum(p.deterministic for p in params)
    rows = window * group
    # overdue requests are served oldest-first, G per pass; a prompt takes ceil(len / R) passes
    bound = max_deferral + num_det + sum(math.ceil(len(p) / rows) for p, q in zip(prompts, params) if q.deterministic)
    waits: dict[int, int] = {}
    longest = 0
    for state, plan in scheduler.history:
        served = set(plan.verify) | {c.rid for c in plan.canonical_prefill}
        for v in state.requests:
            if (v.is_ready_to_verify or (v.is_deterministic and v.is_prefill)) and v.rid not in served:
                waits[v.rid] = waits.get(v.rid, 0) + 1
                longest = max(longest, waits[v.rid])
            else:
                waits.pop(v.rid, None)
    assert 1 <= longest <= bound  # it did defer under load, and not for long


@settings(max_examples=12)
@given(data=st.data())
def test_deterministic_output_matches_default_scheduler_reference(priority_scheduler, wide, data):
    weights, cfg = wide
    canonical = data.draw(ls.canonical_configs(max_window=4, max_group=3), label="canonical")
    mix = data.draw(ls.batch_mixes(vocab_size=cfg.vocab_size, min_size=2, max_size=5, max_prompt_len=12,
                                   max_new_tokens=10), label="mix")
    schedule = data.draw(ls.arrival_schedules(num_requests=len(mix)), label="schedule")
    policy = data.draw(ls.fast_policies(allow_plain=False, max_scale=2.0), label="fast_policy")
    busy_threshold = data.draw(st.integers(0, 3), label="busy_threshold")
    max_deferral = data.draw(st.integers(0, 4), label="max_deferral")

    def build(**kwargs) -> DVRGenerator:
        return DVRGenerator(weights, cfg, window=canonical.window, group=canonical.group,
                            kv_cache_tokens=1024, **kwargs)

    assert_matches_reference(
        lambda: build(scheduler=priority_scheduler(busy_threshold=busy_threshold, max_deferral=max_deferral),
                      fast_policy=policy),
        [p for p, _ in mix],
        [q for _, q in mix],
        schedules=[schedule],
        reference_factory=build,
    )
