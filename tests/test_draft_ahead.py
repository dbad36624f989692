"""Drafting ahead of a window in a canonical pass (``draft_ahead``, the default).

While a deterministic request's window is in a pass that the device has not finished, its fast path
drafts the next window instead of waiting. The first draft re-feeds the window's last candidate at a
position the pass writes: ``DecodeState.protect`` sends that K/V write to the scratch block, so the
canonical K/V stays (invariant 3). When the pass accepts the whole window and commits the token drafted
after it, the drafts stand; otherwise they are dropped, with the one still in flight.

The passes here are made to lag (``lag_passes``): computed at launch, as the device queues them, applied
only some steps later, as on a busy GPU. On the CPU without that, a pass is applied in the step that
launched it and nothing drafts ahead.
"""

from __future__ import annotations

import pytest
import torch

from llm42 import DefaultScheduler, DVRGenerator, Plan, SamplingParams, SchedulerState
from llm42.engine.decode_state import DecodeState
from llm42.model.weights import random_weights
from llm42.policies import FastPolicy, NoisyFastPolicy
from tests.helpers import lag_passes, tiny_config

CFG = tiny_config(max_position_embeddings=256)
WEIGHTS = random_weights(CFG, seed=3)
WINDOW, GROUP = 4, 2
PROMPTS = [[5, 9, 14, 3], [7, 7, 8], [100, 101, 102, 103, 104], [40, 41], [11, 12, 13]]
PARAMS = [
    SamplingParams(max_new_tokens=40, deterministic=True, logprobs=True, ignore_eos=True),
    SamplingParams(max_new_tokens=40, ignore_eos=True),
    SamplingParams(max_new_tokens=33, deterministic=True, temperature=0.8, seed=5, logprobs=True, ignore_eos=True),
    SamplingParams(max_new_tokens=40, deterministic=True, temperature=1.0, top_k=20, seed=9, logprobs=True,
                   ignore_eos=True),
    SamplingParams(max_new_tokens=25, temperature=0.7, ignore_eos=True),
]
DETERMINISTIC = [i for i, p in enumerate(PARAMS) if p.deterministic]


def make(*, lag: int = 0, **kwargs) -> DVRGenerator:
    return lag_passes(DVRGenerator(WEIGHTS, CFG, window=WINDOW, group=GROUP, kv_cache_tokens=2048, block_size=8,
                                   **kwargs), lag)


def deterministic_outputs(gen: DVRGenerator) -> list[tuple[list[int], list[float]]]:
    completions = gen.generate(PROMPTS, PARAMS)
    return [(completions[i].token_ids, completions[i].logprobs) for i in DETERMINISTIC]


@pytest.fixture(scope="module")
def reference() -> list[tuple[list[int], list[float]]]:
    """Each deterministic request alone: the contract's batch-size-1 reference."""
    out = []
    for i in DETERMINISTIC:
        completion = make().generate([PROMPTS[i]], PARAMS[i])[0]
        out.append((completion.token_ids, completion.logprobs))
    return out


@pytest.mark.parametrize("lag", [3, 4])
def test_drafts_ahead_stand_and_commit_the_reference_tokens(reference, lag):
    gen = make(lag=lag)
    assert deterministic_outputs(gen) == reference
    assert gen.stats["ahead_tokens_kept"] > 0, gen.stats  # not vacuous: drafts ahead were kept
    off = make(lag=lag, draft_ahead=False)
    assert deterministic_outputs(off) == reference
    assert off.stats["ahead_tokens_kept"] == off.stats["ahead_tokens_dropped"] == 0
    # what drafting ahead is for: the requests wait fewer steps for their passes
    assert gen.stats["steps"] < off.stats["steps"], (gen.stats, off.stats)


def test_drafts_ahead_of_rolled_back_windows_are_dropped(reference):
    gen = make(lag=2, fast_policy=NoisyFastPolicy(scale=64.0, seed=1))
    assert deterministic_outputs(gen) == reference
    assert gen.stats["rollbacks"] > 0 and gen.stats["ahead_tokens_dropped"] > 0, gen.stats


def _no_drafts_in_the_pass_step(monkeypatch) -> None:
    """A partial window joining a pass gets no draft ahead in that step (as when the step's rows are spent on prompt
    chunks): its first draft ahead then comes after the pass's K/V write at the window's last position."""
    from llm42.engine.requests import Request

    original = Request.num_draftable_ahead
    monkeypatch.setattr(Request, "num_draftable_ahead", lambda self, window, joins_pass=False: original(self, window))


class EarlyVerifyScheduler:
    """The default plan, but a deterministic request's window is verified once it holds two candidates (partly
    full). With ``_no_drafts_in_the_pass_step`` such a request has not drafted ahead before its pass, so its first
    draft ahead comes after the pass's K/V write at the window's last position."""

    def schedule(self, state: SchedulerState) -> Plan:
        plan = DefaultScheduler().schedule(state)
        if plan.has_canonical_pass:
            return plan
        verify, rows = [], 0
        for v in state.requests:
            if (v.is_deterministic and not v.is_prefill and v.num_candidates >= 2 and len(verify) < state.group
                    and rows + 1 + v.num_candidates <= state.num_canonical_rows):
                verify.append(v.rid)
                rows += 1 + v.num_candidates
        if not verify:
            return plan
        return Plan(tuple(r for r in plan.fast_decode if r not in verify), plan.fast_prefill, tuple(verify))


class KVDriftFastPolicy(FastPolicy):
    """The fast path with every GEMM scaled by 1 + 2**-12: its K/V differ from the canonical pass's in most
    bits while its tokens mostly agree, so windows are accepted whole and drafts ahead stand."""

    def linear(self, x, weight, bias=None):
        return super().linear(x, weight, bias) * (1.0 + 2.0 ** -12)


@pytest.mark.parametrize("protect", [True, False])
def test_without_the_protected_window_drafts_ahead_overwrite_canonical_kv(reference, monkeypatch, protect):
    """The window's last position is the pass's to write: the first draft ahead feeds that candidate again,
    and its fast K/V would land there after the pass's. With the protection, deterministic requests match
    their reference; without it (the negative control), the drifted K/V reaches committed positions."""
    if not protect:
        monkeypatch.setattr(DecodeState, "set_protect", lambda self, slot, num_positions: None)
    _no_drafts_in_the_pass_step(monkeypatch)
    gen = make(lag=3, fast_policy=KVDriftFastPolicy(), scheduler=EarlyVerifyScheduler())
    outputs = deterministic_outputs(gen)
    assert gen.stats["ahead_tokens_kept"] > 0, gen.stats  # windows accepted whole: the drafts stood
    assert (outputs == reference) is protect


def test_a_protected_position_keeps_its_kv_through_a_decode_step():
    gen = make()
    rid = gen.submit([5, 9, 14, 3], SamplingParams(max_new_tokens=4, ignore_eos=True))
    gen.step()  # prefill and the first token
    req = gen._pool.running[rid]
    state, kv = gen.decode_state, gen.kv
    position = req.next_position
    slot_index = kv.slots(rid, position, position + 1)[0]
    layer = kv.layers().k[0]  # [num_slots, Hkv, D]
    marker = torch.full_like(layer[slot_index], 7.0)

    def written_after_a_step(protect: bool) -> bool:
        layer[slot_index] = marker
        state.set_protect(req.slot, position + 1 if protect else 0)
        state.set_next(req.slot, None, position)
        state.flush()
        state.stage_batch([req.slot], 1)
        snapshot = state.snapshot()
        state.decode(1, variant=(False, False), max_context_len=position + 1)
        state.restore(snapshot)
        return not torch.equal(layer[slot_index], marker)

    assert not written_after_a_step(protect=True)
    assert written_after_a_step(protect=False)  # the control: unprotected, the step writes there


def _partial_windows_drafting(gen: DVRGenerator) -> list[int]:
    """Record, at every fast launch, how many requests whose partial window goes into this step's pass (the plan's
    ``verify``, not due) also take a decode row in it."""
    counts: list[int] = []
    fast = gen.fast_step
    launch = fast.launch

    def recording(plan, *args):
        rows, pool = set(plan.fast_decode), gen._pool
        counts.append(sum(1 for rid in plan.verify if rid in rows
                          and pool.running[rid].num_speculable(pool.window) > 0))
        return launch(plan, *args)

    fast.launch = recording
    return counts


@pytest.mark.parametrize("lag", [2, 3])
def test_a_partial_window_joining_a_pass_drafts_ahead_in_that_step(reference, monkeypatch, lag):
    """A partial window the scheduler puts in this step's pass (``EarlyVerifyScheduler``: two candidates or more)
    drafts ahead in the same step, as a due one does, instead of losing the step's row: the same committed tokens
    and log-probs as each request alone, drafts ahead kept, and fewer steps than without it (the negative control:
    ``joins_pass`` ignored, such a request gets no row in that step)."""
    gen = make(lag=lag, scheduler=EarlyVerifyScheduler())
    counts = _partial_windows_drafting(gen)
    assert deterministic_outputs(gen) == reference
    assert sum(counts) > 0, "no partial window drafted ahead in the step its pass launched"
    assert gen.stats["ahead_tokens_kept"] > 0, gen.stats

    _no_drafts_in_the_pass_step(monkeypatch)
    old = make(lag=lag, scheduler=EarlyVerifyScheduler())
    old_counts = _partial_windows_drafting(old)
    assert deterministic_outputs(old) == reference
    assert sum(old_counts) == 0
    assert gen.stats["steps"] < old.stats["steps"], (gen.stats["steps"], old.stats["steps"])


def test_without_overlap_a_window_holds_the_candidates_the_plan_counted():
    """``overlap=False`` reads a step's drafts back before its pass is launched: a partial window joining the pass
    drafts ahead in that step, and that draft must stay ahead of the window rather than grow it past the rows the
    plan was checked for (before round 30 the pass got 9 rows of its 8 and raised). Found by
    ``llm42.testing.strategies.engine_knobs``."""
    mix = [([0], SamplingParams(max_new_tokens=1, deterministic=True, logprobs=True)),
           ([0], SamplingParams(max_new_tokens=4, deterministic=True, logprobs=True)),
           ([0], SamplingParams(max_new_tokens=1, logprobs=True)),
           ([0] * 6, SamplingParams(max_new_tokens=1, deterministic=True, logprobs=True))]
    prompts, params = [p for p, _ in mix], [q for _, q in mix]
    gen = DVRGenerator(WEIGHTS, CFG, window=WINDOW, group=GROUP, kv_cache_tokens=2048, block_size=8,
                       fast_policy=NoisyFastPolicy(scale=1.0, seed=0), max_num_seqs=2, max_fast_tokens=2,
                       overlap=False, max_canonical_tokens=WINDOW * GROUP)
    got = gen.generate(prompts, params)
    for prompt, q, c in zip(prompts, params, got):
        if q.deterministic:
            alone = make().generate([prompt], q)[0]
            assert (c.token_ids, c.logprobs) == (alone.token_ids, alone.logprobs)


def test_dvr_ab_serves_the_draft_ahead_off_variant_with_the_defaults_outputs(tmp_path, monkeypatch):
    """The benchmark's round-45 variant (benchmarks/device/dvr_ab.py, scripted for the next device call) end to end
    on the CPU: the default's deterministic outputs, and no token drafted ahead of a window."""
    from tests.helpers import run_dvr_ab

    got = run_dvr_ab(tmp_path / "ab.json", monkeypatch, "default,draft_ahead_off", "--num-requests", "4")
    (check,) = got["deterministic_outputs_identical"].values()
    assert check["num_checked"] > 0 and check["num_identical"] == check["num_checked"]
    assert got["variants"]["draft_ahead_off"] == {"draft_ahead": False}
    off = got["runs"]["draft_ahead_off"]["dvr@50"]
    assert off["ahead_tokens_kept"] == off["ahead_tokens_dropped"] == 0
    # control: the default drafts ahead on the same requests
    default = got["runs"]["default"]["dvr@50"]
    assert default["ahead_tokens_kept"] + default["ahead_tokens_dropped"] > 0
