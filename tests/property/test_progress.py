"""Progress: however wrong the fast path, every canonical pass commits at least one token for every
request in it, so every deterministic request finishes (and still matches its reference)."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from llm42.inputs import StepInputs
from llm42.policies import FastPolicy, NoisyFastPolicy
from llm42.testing import first_divergence, run_schedule
from llm42.testing import strategies as ls

from .schedulers import SCHEDULER_KINDS, RecordingScheduler, make_scheduler

MAX_NEW_TOKENS = 12
MAX_PROMPT_LEN = 24


class WrongFastPolicy(FastPolicy):
    """A fast path that is always wrong for greedy rows: it negates the logits, so argmax becomes argmin."""

    name = "wrong_fast"

    def process_logits(self, logits: torch.Tensor, inputs: StepInputs) -> torch.Tensor:
        return -logits


def _wrong_policies():
    return st.sampled_from(["wrong", "noisy"]).map(
        lambda kind: WrongFastPolicy() if kind == "wrong" else NoisyFastPolicy(scale=1000.0, seed=0)
    )


@given(data=st.data())
def test_every_canonical_pass_commits_for_every_request_in_it(wide_model, data):
    vocab = wide_model.vocab_size
    canonical = data.draw(ls.canonical_configs(max_window=4, max_group=3), label="canonical")
    mix = data.draw(ls.batch_mixes(vocab_size=vocab, max_size=4, max_prompt_len=MAX_PROMPT_LEN,
                                   max_new_tokens=MAX_NEW_TOKENS), label="mix")
    policy = data.draw(_wrong_policies(), label="fast_policy")
    scheduler_kind = data.draw(st.sampled_from(SCHEDULER_KINDS), label="scheduler")
    recorder = RecordingScheduler(make_scheduler(scheduler_kind, data.draw(st.integers(0, 2**16), label="seed")))
    schedule = data.draw(ls.arrival_schedules(num_requests=len(mix)), label="schedule")
    prompts = [p for p, _ in mix]
    params = [q for _, q in mix]

    step_events: list[dict[int, list[int]]] = []
    gen = wide_model.factory(canonical, fast_policy=policy, scheduler=lambda: recorder)()
    # run_schedule raises unless every request finishes
    out = run_schedule(gen, prompts, params, schedule, max_steps=2000,
                       on_step=lambda _, events: step_events.append(events))
    by_rid = {c.request_id: (c, p) for c, p in zip(out, params)}

    assert len(recorder.history) == len(step_events) == gen.stats["steps"]
    num_passes = 0
    num_committing = 0  # (request, pass) pairs that must commit: verify windows and last prompt chunks
    num_verified: dict[int, int] = {}
    for (state, plan), events in zip(recorder.history, step_events):
        views = {v.rid: v for v in state.requests}
        num_passes += plan.has_canonical_pass
        for rid in plan.verify:
            # the pass that verified rid committed >= 1 token for it (its fast step drafts nothing for it)
            assert len(events.get(rid, [])) >= 1, f"a canonical pass committed nothing for request {rid}"
            num_verified[rid] = num_verified.get(rid, 0) + 1
        num_committing += len(plan.verify)
        for chunk in plan.canonical_prefill:
            is_last_chunk = chunk.num_tokens == views[chunk.rid].num_prompt_remaining
            assert len(events.get(chunk.rid, [])) == int(is_last_chunk)
            num_committing += is_last_chunk
        in_pass = set(plan.verify) | {c.rid for c in plan.canonical_prefill}
        for rid in events:
            # a deterministic request's tokens are committed by canonical passes only
            assert rid in in_pass or not by_rid[rid][1].deterministic
    assert num_passes == gen.stats["canonical_passes"]
    num_det_tokens = sum(len(c.token_ids) for c, p in by_rid.values() if p.deterministic)
    assert num_det_tokens >= num_committing

    for c, p in by_rid.values():
        assert c.finish_reason in ("stop", "length")
        if not (p.deterministic and p.is_greedy and isinstance(policy, WrongFastPolicy)):
            continue
        # every greedy candidate is wrong: one canonical token per verify pass, one from the prompt's last chunk
        assert len(c.token_ids) == 1 + num_verified.get(c.request_id, 0)
        assert c.num_rollbacks <= num_verified.get(c.request_id, 0)
    if all(p.is_greedy for p in params) and isinstance(policy, WrongFastPolicy):
        # nothing drafted is ever accepted: exactly one committed token per request per pass
        assert gen.stats["accepted_tokens"] == 0
        assert num_det_tokens == num_committing


@given(data=st.data())
def test_always_wrong_fast_path_still_gives_the_reference_output(wide_model, data):
    vocab = wide_model.vocab_size
    canonical = data.draw(ls.canonical_configs(min_window=2, max_window=4, max_group=3), label="canonical")
    prompt = data.draw(ls.prompts(vocab_size=vocab, max_len=MAX_PROMPT_LEN), label="prompt")
    params = data.draw(ls.sampling_params(max_new_tokens=MAX_NEW_TOKENS, deterministic=True, logprobs=True,
                                          vocab_size=vocab), label="params")
    reference = wide_model.factory(canonical)().generate([prompt], params)[0]
    gen = wide_model.factory(canonical, fast_policy=WrongFastPolicy())()
    out = gen.generate([prompt], params)[0]
    divergence = first_divergence(reference, out)
    assert divergence is None, divergence.describe()
    if params.is_greedy:
        # every candidate drafted was rolled back
        assert out.num_recomputed == gen.stats["fast_tokens"]
        assert gen.stats["accepted_tokens"] == 0
