"""DefaultScheduler(prompt_share=...): while deterministic prompts wait for the canonical pass, verify windows
leave them a share of each pass's rows, so a deterministic prompt admitted beside many decoding deterministic
requests is not starved by their windows. Scheduling never changes a committed bit."""

from __future__ import annotations

import pytest

from llm42 import DefaultScheduler, DVRGenerator, SamplingParams
from llm42.model.weights import random_weights
from llm42.scheduler import RequestView, SchedulerState, canonical_rows, validate_plan
from tests.helpers import first_token_steps, tiny_config
from tests.property.schedulers import RecordingScheduler

WINDOW, GROUP = 4, 2  # R = 8
R = WINDOW * GROUP
WIDE = 4 * R  # a wide pass: 32 rows, results on all of them


def _decoding(rid: int) -> RequestView:
    """A deterministic request whose window is due: WINDOW - 1 candidates, nothing more to draft."""
    return RequestView(rid, True, 6, 6, 2, WINDOW - 1, 0, rid)


def _prompt(rid: int, remaining: int) -> RequestView:
    return RequestView(rid, True, remaining, 0, 0, 0, 0, rid)


def _state(views) -> SchedulerState:
    return SchedulerState(tuple(views), WINDOW, GROUP, 64, 0, WIDE, WIDE)


def _split(plan, state) -> tuple[int, int]:
    """(rows of windows, rows of prompt chunks) in ``plan``'s canonical pass."""
    views = {v.rid: v for v in state.requests}
    prompt_rows = sum(c.num_tokens for c in plan.canonical_prefill)
    return canonical_rows(plan, views) - prompt_rows, prompt_rows


def test_windows_leave_the_share_of_a_pass_to_waiting_prompts():
    state = _state([*(_decoding(i) for i in range(8)), _prompt(8, 100)])
    starved = DefaultScheduler().schedule(state)  # the negative control: windows take every row
    validate_plan(starved, state)
    assert _split(starved, state) == (WIDE, 0)
    for share, windows in ((0.5, WIDE // 2), (0.25, 3 * WIDE // 4)):
        plan = DefaultScheduler(prompt_share=share).schedule(state)
        validate_plan(plan, state)
        assert _split(plan, state) == (windows, WIDE - windows), share
        assert plan.verify == tuple(range(windows // WINDOW))  # the oldest windows first


def test_the_share_is_bounded_by_what_the_prompts_still_need_and_lapses_without_prompts():
    state = _state([*(_decoding(i) for i in range(8)), _prompt(8, 5)])
    plan = DefaultScheduler(prompt_share=0.5).schedule(state)
    assert _split(plan, state) == (24, 5)  # the 5-row reserve leaves 27 rows: six whole windows
    only_windows = _state([_decoding(i) for i in range(8)])
    assert _split(DefaultScheduler(prompt_share=1.0).schedule(only_windows), only_windows) == (WIDE, 0)


@pytest.mark.parametrize("bad", [-0.1, 1.5, True, "half", None])
def test_a_bad_prompt_share_is_refused_naming_the_field(bad):
    with pytest.raises(ValueError, match="prompt_share"):
        DefaultScheduler(prompt_share=bad)


CFG = tiny_config(max_position_embeddings=256)
WEIGHTS = random_weights(CFG, seed=5)
SHORT = [[(5 * i + 3 * j) % (CFG.vocab_size - 3) + 3 for j in range(4)] for i in range(24)]
LONG = [[(11 * i + 7 * j) % (CFG.vocab_size - 3) + 3 for j in range(90)] for i in range(3)]


def _run(scheduler):
    gen = DVRGenerator(WEIGHTS, CFG, window=WINDOW, group=GROUP, kv_cache_tokens=4096, block_size=8,
                       max_fast_tokens=64, max_canonical_tokens=WIDE, wide_verify=True, max_num_seqs=64,
                       scheduler=RecordingScheduler(scheduler))
    params = [SamplingParams(max_new_tokens=24, deterministic=True, ignore_eos=True, seed=i,
                             temperature=0.9 if i % 2 else 0.0, top_k=20) for i in range(len(SHORT) + len(LONG))]
    short = [gen.submit(p, params[i]) for i, p in enumerate(SHORT)]
    for _ in range(4):  # the short requests decode before the long prompts arrive
        gen.step()
    long = [gen.submit(p, params[len(SHORT) + i]) for i, p in enumerate(LONG)]
    first = first_token_steps(gen)
    outputs = [gen.result(r).token_ids for r in short + long]
    return outputs, max(first[r] for r in long), gen.scheduler.history


def test_the_share_brings_deterministic_prompts_first_tokens_earlier_and_commits_the_same_bits():
    base_out, base_first, base_history = _run(DefaultScheduler())
    share_out, share_first, _ = _run(DefaultScheduler(prompt_share=0.5))
    assert share_out == base_out
    # not vacuous: without the share some pass held windows only while a deterministic prompt was waiting
    assert any(plan.verify and not plan.canonical_prefill
               and any(v.is_deterministic and v.is_prefill for v in state.requests)
               for state, plan in base_history)
    assert share_first < base_first, (share_first, base_first)
