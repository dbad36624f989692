"""The online API: abort stops a request at any point of the lagged loop and keeps what it committed;
result() hands a Completion over once; generate() and stream() clean up after themselves; a stream
gets every token whoever steps; finishing a request never loses it."""

from __future__ import annotations

import warnings

import hypothesis.strategies as st
import pytest
from hypothesis import given

from llm42 import DVRGenerator, SamplingParams
from llm42.model.weights import random_weights
from llm42.policies import FixedShapePolicy, NoisyFastPolicy
from llm42.runner import ModelRunner
from llm42.scheduler import DefaultScheduler
from llm42.verify import CanonicalConfig, LaunchedPass, Verifier
from tests.helpers import tiny_config

CFG = tiny_config()
WEIGHTS = random_weights(CFG, seed=11, lm_head_std=0.05)
WINDOW, GROUP = 4, 2


class _ReadyOnSecondAsk(LaunchedPass):
    """A pass that is still running when the step that launched it asks, as on a busy GPU."""

    def __init__(self, work, result):
        super().__init__(work, result)
        self.num_asked = 0

    def is_ready(self) -> bool:
        self.num_asked += 1
        return self.num_asked > 1


class LaggingVerifier(Verifier):
    """The default verifier with the device lag of CUDA: a pass is applied one step after its launch."""

    def launch(self, work, kv):
        launched = super().launch(work, kv)
        return _ReadyOnSecondAsk(launched.work, launched.result)


def make(*, lagging: bool = False, noisy: bool = True, **kwargs) -> DVRGenerator:
    if lagging:
        kwargs["verifier"] = LaggingVerifier(ModelRunner(WEIGHTS, CFG), FixedShapePolicy(),
                                             CanonicalConfig(window=WINDOW, group=GROUP))
    if noisy:
        kwargs["fast_policy"] = NoisyFastPolicy(scale=2.0, seed=3)
    return DVRGenerator(WEIGHTS, CFG, window=WINDOW, group=GROUP, kv_cache_tokens=1024, block_size=8, **kwargs)


_ALONE: dict[tuple, object] = {}


def alone(prompt: list[int], params: SamplingParams):
    """The batch-size-1 reference, memoised (it is the same function of its inputs every time)."""
    key = (tuple(prompt), params)
    if key not in _ALONE:
        _ALONE[key] = make(noisy=False).generate([prompt], params)[0]
    return _ALONE[key]


DET = SamplingParams(max_new_tokens=12, deterministic=True, logprobs=True, ignore_eos=True)
DET_SAMPLED = SamplingParams(max_new_tokens=12, deterministic=True, temperature=0.8, seed=5, ignore_eos=True)
FREE = SamplingParams(max_new_tokens=12, ignore_eos=True)
PROMPTS = [[5, 9, 14, 3], [7, 7, 8], [100, 101, 102, 103, 104], [40, 41]]
PARAMS = [DET, FREE, DET_SAMPLED, DET]


def assert_idle_holds_nothing(gen: DVRGenerator) -> None:
    kv = gen.kv
    assert not gen.has_unfinished()
    assert kv.num_used_blocks == 0
    assert kv.num_free_blocks + kv.num_cached_blocks == kv.num_blocks
    assert kv.num_unreserved_blocks == kv.num_blocks


def step_until(gen: DVRGenerator, rid: int, condition, what: str) -> None:
    """Step until running request ``rid`` meets ``condition`` (the state a test needs, so it is never vacuous)."""
    for _ in range(200):
        gen.step()
        req = gen._pool.running.get(rid)
        if req is not None and condition(req):
            return
    pytest.fail(f"request {rid} never {what}")


def run_to_end(gen: DVRGenerator) -> None:
    while gen.has_unfinished():
        gen.step()


# -- abort -----------------------------------------------------------------------------------------

def test_abort_of_a_waiting_request_gives_an_empty_aborted_completion():
    gen = make(max_num_seqs=1)
    first = gen.submit(PROMPTS[0], DET)
    second = gen.submit(PROMPTS[1], FREE)
    gen.step()
    assert gen.committed_tokens(second) == []  # still queued behind the one seat
    out = gen.abort(second)
    assert (out.request_id, out.token_ids, out.finish_reason) == (second, [], "abort")
    assert gen.is_finished(second)
    run_to_end(gen)
    assert gen.result(first).token_ids == alone(PROMPTS[0], DET).token_ids
    assert_idle_holds_nothing(gen)


def test_abort_mid_canonical_pass_keeps_the_committed_prefix_and_others_stay_bit_exact():
    gen = make(lagging=True)
    rids = [gen.submit(p, s) for p, s in zip(PROMPTS, PARAMS)]
    target = rids[0]
    step_until(gen, target, lambda req: req.is_verifying and req.token_ids,
               "sat in a canonical pass in flight with committed tokens")
    assert gen.passes.oldest is not None  # the precondition of this test, not a vacuous pass
    before = gen.committed_tokens(target)
    out = gen.abort(target)
    assert out.token_ids[: len(before)] == before  # the pass in flight may still commit more
    reference = alone(PROMPTS[0], DET)
    assert out.token_ids == reference.token_ids[: len(out.token_ids)]
    assert out.logprobs == reference.logprobs[: len(out.token_ids)]
    assert out.finish_reason == "abort"
    assert not gen.kv.holds(target)
    run_to_end(gen)
    for rid, prompt, params in zip(rids[1:], PROMPTS[1:], PARAMS[1:]):
        got = gen.result(rid)
        if params.deterministic:
            assert got.token_ids == alone(prompt, params).token_ids
    assert_idle_holds_nothing(gen)


def test_abort_with_fast_tokens_in_flight_drops_them_and_others_continue():
    gen = make()
    rids = [gen.submit(p, s) for p, s in zip(PROMPTS, PARAMS)]
    target = rids[1]  # the free request: its fast tokens are commits
    step_until(gen, target, lambda req: req.num_pending and req.token_ids, "had a fast token in flight")
    before = gen.committed_tokens(target)
    out = gen.abort(target)
    assert out.token_ids == before and out.finish_reason == "abort"
    run_to_end(gen)  # the in-flight token is read back and dropped: it is past the request's end
    for rid, prompt, params in zip(rids, PROMPTS, PARAMS):
        if rid != target and params.deterministic:
            assert gen.result(rid).token_ids == alone(prompt, params).token_ids
    assert_idle_holds_nothing(gen)


def test_abort_of_a_finished_request_returns_its_completion_once():
    gen = make()
    rid = gen.submit(PROMPTS[3], DET)
    run_to_end(gen)
    out = gen.abort(rid)
    assert out.finish_reason == "length" and out.token_ids == alone(PROMPTS[3], DET).token_ids
    with pytest.raises(KeyError, match="already taken"):
        gen.abort(rid)
    with pytest.raises(KeyError, match="already taken"):
        gen.result(rid)
    with pytest.raises(KeyError, match="unknown request id"):
        gen.abort(rid + 1)
    with pytest.raises(KeyError, match="unknown request id"):
        gen.is_finished(-1)


@given(data=st.data())
def test_aborts_at_random_points_lose_nothing_and_leave_others_bit_exact(data):
    num = data.draw(st.integers(2, 5), label="requests")
    choices = list(zip(PROMPTS, PARAMS))
    picked = [data.draw(st.sampled_from(choices), label=f"request {i}") for i in range(num)]
    abort_at = {i: data.draw(st.integers(0, 12), label=f"abort {i} at step") for i in range(num)
                if data.draw(st.booleans(), label=f"abort {i}")}
    gen = make(lagging=data.draw(st.booleans(), label="lagging"), max_num_seqs=data.draw(st.integers(1, 4)),
               prompt_drafts=data.draw(st.booleans(), label="prompt_drafts"))
    rids = [gen.submit(p, s) for p, s in picked]
    streamed = {rid: [] for rid in rids}
    aborted = {}
    step = 0
    while gen.has_unfinished():
        for i, at in abort_at.items():
            if at == step and rids[i] not in aborted:
                before = gen.committed_tokens(rids[i]) if not gen.is_finished(rids[i]) else None
                aborted[rids[i]] = (gen.abort(rids[i]), before)
        for rid, tokens in gen.step().items():
            streamed[rid] += tokens
        step += 1
    for i, (rid, (prompt, params)) in enumerate(zip(rids, picked)):
        out, before = aborted[rid] if rid in aborted else (gen.result(rid), None)
        assert out.token_ids == streamed[rid]  # every committed token was reported, none was lost
        if before is not None:
            assert out.token_ids[: len(before)] == before
        if params.deterministic:
            reference = alone(prompt, params).token_ids
            if out.finish_reason == "abort":
                assert out.token_ids == reference[: len(out.token_ids)]
            else:
                assert out.token_ids == reference
    assert_idle_holds_nothing(gen)
    assert not gen._pool.finished  # every Completion was handed over: nothing is kept


# -- result hands over once ---------------------------------------------------------------------------

def test_result_hands_the_completion_over_once_and_forgets_it():
    gen = make()
    rids = [gen.submit(p, s) for p, s in zip(PROMPTS, PARAMS)]
    assert not any(gen.is_finished(rid) for rid in rids)
    run_to_end(gen)
    assert all(gen.is_finished(rid) for rid in rids)
    assert len(gen._pool.finished) == len(rids)  # negative control: kept until taken
    outs = [gen.result(rid) for rid in rids]
    assert [o.request_id for o in outs] == rids
    assert not gen._pool.finished
    for rid in rids:
        assert gen.is_finished(rid)
        with pytest.raises(KeyError, match="already taken"):
            gen.result(rid)
        with pytest.raises(KeyError, match="already taken"):
            gen.committed_tokens(rid)


def test_generate_and_stream_keep_no_completion():
    gen = make()
    gen.generate(PROMPTS, PARAMS)
    list(gen.stream(PROMPTS, PARAMS))
    assert not gen._pool.finished and not gen._owners


# -- stream ---------------------------------------------------------------------------------------------

def test_stream_gets_every_token_when_another_caller_steps():
    gen = make()
    other = gen.submit(PROMPTS[1], FREE)
    stream = gen.stream([PROMPTS[0], PROMPTS[2]], [DET, DET_SAMPLED])
    got = {0: [], 1: []}
    index, tokens = next(stream)  # submits and steps until the first commit
    got[index] += tokens
    committed = gen.stats["committed_tokens"]
    outside = {}
    for _ in range(6):  # another caller steps: the stream's tokens must not be lost to it
        for rid, new in gen.step().items():
            outside.setdefault(rid, []).extend(new)
    assert gen.stats["committed_tokens"] - committed > sum(map(len, outside.values())), (
        "negative control: the outside steps committed stream tokens too")
    assert set(outside) <= {other}  # step() reports only requests that are not a stream's
    for index, tokens in stream:
        got[index] += tokens
    assert got[0] == alone(PROMPTS[0], DET).token_ids
    assert got[1] == alone(PROMPTS[2], DET_SAMPLED).token_ids
    run_to_end(gen)
    assert gen.result(other).finish_reason == "length"
    assert_idle_holds_nothing(gen)


@pytest.mark.parametrize("how", ["break", "close", "raise"])
def test_stream_stopped_early_aborts_its_requests(how):
    gen = make()
    keep = gen.submit(PROMPTS[0], DET)
    stream = gen.stream(PROMPTS[1:], PARAMS[1:])
    if how == "break":
        for _ in stream:
            break
        del stream  # a for loop's break leaves the generator to the garbage collector
    elif how == "close":
        next(stream)
        stream.close()
    else:
        with pytest.raises(ZeroDivisionError):
            for _ in stream:
                raise ZeroDivisionError
        stream.close()
    assert gen.is_finished(keep) is False  # the other caller's request was not touched
    assert len(gen._pool.running) + len(gen._pool.waiting) == 1
    run_to_end(gen)
    assert gen.result(keep).token_ids == alone(PROMPTS[0], DET).token_ids
    assert not gen._pool.finished and not gen._owners
    assert_idle_holds_nothing(gen)


# -- generate interrupted -------------------------------------------------------------------------------

class InterruptingScheduler(DefaultScheduler):
    def __init__(self, at_call: int):
        self.at_call = at_call
        self.num_calls = 0

    def schedule(self, state):
        self.num_calls += 1
        if self.num_calls == self.at_call:
            raise KeyboardInterrupt
        return super().schedule(state)


class InterruptingFastPolicy(NoisyFastPolicy):
    """Ctrl-C in the middle of a fast forward pass (after some K/V writes)."""

    def __init__(self, at_call: int):
        super().__init__(scale=2.0, seed=3)
        self.at_call = at_call
        self.num_calls = 0

    def attention(self, *args, **kwargs):
        self.num_calls += 1
        if self.num_calls == self.at_call:
            raise KeyboardInterrupt
        return super().attention(*args, **kwargs)


@pytest.mark.parametrize(("where", "at_call"), [("scheduler", 3), ("fast attention", 5), ("fast attention", 12)])
def test_interrupted_generate_aborts_its_requests_only(where, at_call):
    if where == "scheduler":
        gen = make(scheduler=InterruptingScheduler(at_call))
    else:
        gen = make(noisy=False, fast_policy=InterruptingFastPolicy(at_call))
    keep = gen.submit(PROMPTS[0], DET)
    with pytest.raises(KeyboardInterrupt):
        gen.generate(PROMPTS[1:], PARAMS[1:])
    assert len(gen._pool.running) + len(gen._pool.waiting) == 1  # only the submitted one is left
    assert not gen._pool.finished and not gen._owners
    run_to_end(gen)
    assert gen.result(keep).token_ids == alone(PROMPTS[0], DET).token_ids
    assert_idle_holds_nothing(gen)
    outs = gen.generate(PROMPTS, PARAMS)  # the generator is fully usable afterwards
    for out, prompt, params in zip(outs, PROMPTS, PARAMS):
        if params.deterministic:
            assert out.token_ids == alone(prompt, params).token_ids


def test_tiny_temperature_generates_the_greedy_tokens():
    gen = make(noisy=False)
    tiny = SamplingParams(max_new_tokens=8, temperature=1e-40, seed=9, deterministic=True, ignore_eos=True)
    greedy = SamplingParams(max_new_tokens=8, deterministic=True, ignore_eos=True)
    out_tiny, out_greedy = gen.generate([PROMPTS[0], PROMPTS[0]], [tiny, greedy])
    assert out_tiny.token_ids == out_greedy.token_ids


# -- finishing never loses a request ---------------------------------------------------------------------

class DecodeFails:
    """A tokenizer whose decode raises for one request's tokens."""

    def __init__(self, bad_first_token: int):
        self.bad_first_token = bad_first_token

    def __call__(self, text, **kwargs):
        return {"input_ids": [3 + ord(c) % 50 for c in text]}

    def decode(self, token_ids, **kwargs):
        if token_ids and token_ids[0] == self.bad_first_token:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected")
        return " ".join(map(str, token_ids))


def test_failing_decode_still_produces_the_completion_with_text_none():
    bad = alone(PROMPTS[0], DET).token_ids[0]
    gen = make(tokenizer=DecodeFails(bad))
    rids = [gen.submit(p, s) for p, s in zip(PROMPTS[:2], PARAMS[:2])]
    with pytest.warns(RuntimeWarning, match=f"request {rids[0]}.*text is None"):
        run_to_end(gen)
    failed, fine = gen.result(rids[0]), gen.result(rids[1])
    assert failed.text is None and failed.token_ids == alone(PROMPTS[0], DET).token_ids
    assert failed.finish_reason == "length"
    assert fine.text == " ".join(map(str, fine.token_ids))  # negative control: decode works otherwise
    assert_idle_holds_nothing(gen)


def test_failing_kv_free_keeps_the_completion_and_frees_the_blocks_on_retry():
    gen = make()
    real_free = gen.kv.free
    failures = []

    def free_fails_once(rid):
        if not failures:
            failures.append(rid)
            raise RuntimeError("injected store fault")
        real_free(rid)

    gen.kv.free = free_fails_once
    rids = [gen.submit(p, s) for p, s in zip(PROMPTS, PARAMS)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        while not failures:
            gen.step()
    assert any("injected store fault" in str(w.message) for w in caught)
    failed = failures[0]
    assert gen.is_finished(failed)
    assert gen.kv.holds(failed)  # negative control: its blocks are held right after the failure
    run_to_end(gen)
    gen.step()  # an idle step still retries
    assert not gen.kv.holds(failed)
    for rid, prompt, params in zip(rids, PROMPTS, PARAMS):
        out = gen.result(rid)
        if params.deterministic:
            assert out.token_ids == alone(prompt, params).token_ids
    assert_idle_holds_nothing(gen)


def test_tokens_an_abort_commits_for_others_reach_the_next_step_even_with_nothing_left_unfinished():
    """abort(y) applies the canonical pass in flight; that pass may finish x. x's tokens must still be
    reported (by the next step, which AsyncEngine runs while a stream is open), never stranded."""
    # oldest first: x's prompt goes into the pass y's does (a budget order would put y's, the longer, first)
    gen = make(lagging=True, noisy=False, scheduler=DefaultScheduler(order="arrival"))
    one = SamplingParams(max_new_tokens=1, deterministic=True, ignore_eos=True)
    x, y = gen.submit(PROMPTS[0], one), gen.submit(PROMPTS[2], DET)
    reported: list[int] = []
    for _ in range(50):
        reported += gen.step().get(x, [])
        in_flight = gen.passes.oldest
        if in_flight is not None and gen._pool.running.get(y) is not None and gen._pool.running[y].is_verifying \
                and not gen.is_finished(x) and x in {w.segment.rid for w in in_flight.work}:
            break
    else:
        pytest.fail("x and y never shared a canonical pass in flight")
    gen.abort(y)
    assert gen.is_finished(x) and not gen.has_unfinished()  # the applied pass finished x: the case at stake
    reported += gen.step().get(x, [])
    assert reported == gen.result(x).token_ids == alone(PROMPTS[0], one).token_ids
    assert_idle_holds_nothing(gen)
