"""``canonical_thread=True``: on the CPU each canonical pass runs on a worker thread while fast steps go on.

The contract must not notice: deterministic outputs equal their alone-runs and the same
requests run with passes inline, bit for bit, with a forced-divergence fast path (so passes
roll back) and with passes slow enough that fast steps really run while one is in flight
(counted: the tests fail if no step ever saw a pass still running). abort, score and close
work with a pass in flight. A pass that raises on its thread: tests/test_failure_isolation.py.
"""

from __future__ import annotations

import random
import time

import pytest
import torch

from llm42 import DVRGenerator, SamplingParams
from llm42.model.weights import random_weights
from llm42.policies import FixedShapePolicy, NoisyFastPolicy
from tests.helpers import tiny_config

CFG = tiny_config(max_position_embeddings=256)
WEIGHTS = random_weights(CFG, seed=11, lm_head_std=0.05)


class SlowCanonicalPolicy(FixedShapePolicy):
    """The canonical policy, 1 ms slower per attention call: a pass outlasts a fast step."""

    def attention(self, *args, **kwargs):
        time.sleep(1e-3)
        return super().attention(*args, **kwargs)


def _requests(seed: int, num: int):
    rng = random.Random(seed)
    prompts, params = [], []
    for i in range(num):
        prompts.append([1] + [rng.randrange(3, CFG.vocab_size) for _ in range(rng.randint(1, 20))])
        params.append(SamplingParams(max_new_tokens=rng.randint(3, 24), deterministic=i % 3 != 2,
                                     temperature=rng.choice([0.0, 0.9]), top_k=rng.choice([0, 12]), seed=i,
                                     logprobs=True))
    return prompts, params


def _generator(*, thread: bool, slow: bool = True, noisy: bool = True) -> DVRGenerator:
    return DVRGenerator(WEIGHTS, CFG, window=4, group=2, kv_cache_tokens=4096, max_fast_tokens=64,
                        canonical_policy=SlowCanonicalPolicy() if slow else None,
                        fast_policy=NoisyFastPolicy(scale=2.0, seed=3) if noisy else None, canonical_thread=thread)


def _run_counting_overlap(gen: DVRGenerator, prompts, params) -> tuple[list, int]:
    """Step until done; also how many steps ended with a pass still running on the worker thread."""
    rids = [gen.submit(p, s) for p, s in zip(prompts, params)]
    num_overlapped = 0
    while gen.has_unfinished():
        gen.step()
        in_flight = gen.passes.oldest
        num_overlapped += in_flight is not None and not in_flight.is_ready()
    return [gen.result(rid) for rid in rids], num_overlapped


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_deterministic_outputs_are_the_same_with_passes_on_a_worker_thread(seed):
    prompts, params = _requests(seed, 12)
    inline, inline_overlapped = _run_counting_overlap(_generator(thread=False), prompts, params)
    threaded_gen = _generator(thread=True)
    threaded, num_overlapped = _run_counting_overlap(threaded_gen, prompts, params)
    assert inline_overlapped == 0  # inline, a pass is done when launch returns
    assert num_overlapped > 0, "no step ran while a pass was in flight: the test would prove nothing"
    assert threaded_gen.stats["rollbacks"] > 0  # the noisy fast path forced rollbacks through the thread
    alone = _generator(thread=False, slow=False, noisy=False)
    num_det = 0
    for prompt, p, a, b in zip(prompts, params, inline, threaded):
        if p.deterministic:
            num_det += 1
            ref = alone.generate([prompt], p)[0]
            assert (b.token_ids, b.logprobs) == (a.token_ids, a.logprobs) == (ref.token_ids, ref.logprobs)
    assert num_det >= 6


def test_negative_control_free_requests_do_drift_under_the_noisy_fast_path():
    """The comparison above can fail: the same check on free requests (never verified) sees the noise."""
    prompts, params = _requests(0, 12)
    free = [SamplingParams(max_new_tokens=p.max_new_tokens, temperature=p.temperature, top_k=p.top_k, seed=p.seed,
                           ignore_eos=True) for p in params]
    noisy, _ = _run_counting_overlap(_generator(thread=True), prompts, free)
    clean, _ = _run_counting_overlap(_generator(thread=True, noisy=False), prompts, free)
    assert sum(a.token_ids != b.token_ids for a, b in zip(noisy, clean)) >= 3


def _step_until_a_pass_is_running(gen: DVRGenerator, limit: int = 200) -> None:
    for _ in range(limit):
        gen.step()
        in_flight = gen.passes.oldest
        if in_flight is not None and not in_flight.is_ready():
            return
    pytest.fail("no canonical pass was ever seen running")


def test_abort_score_and_close_with_a_pass_on_the_thread():
    prompt = [1, 9, 33, 70, 4]
    params = SamplingParams(max_new_tokens=20, deterministic=True, ignore_eos=True, logprobs=True)
    reference = _generator(thread=False, slow=False, noisy=False).generate([prompt], params)[0]
    gen = _generator(thread=True)
    kept = gen.submit(prompt, params)
    gone = gen.submit(prompt, params)
    _step_until_a_pass_is_running(gen)
    aborted = gen.abort(gone)  # applies the pass in flight first: what it committed is kept
    assert aborted.finish_reason == "abort"
    assert aborted.token_ids == reference.token_ids[: len(aborted.token_ids)]
    _step_until_a_pass_is_running(gen)
    # score() shares the pass's static buffers: it applies the pass in flight, then scores
    assert gen.score([prompt], [reference.token_ids], params) == [reference.logprobs]
    while gen.has_unfinished():
        gen.step()
    done = gen.result(kept)
    assert (done.token_ids, done.logprobs) == (reference.token_ids, reference.logprobs)
    gen.submit(prompt, params)
    _step_until_a_pass_is_running(gen)
    workers = list(gen.verifier.canonical_pass._worker._threads)
    assert workers and all(t.is_alive() for t in workers)
    gen.close()  # waits for the pass, frees everything, stops the worker thread
    assert not any(t.is_alive() for t in workers)


def test_canonical_thread_must_be_a_bool():
    with pytest.raises(TypeError, match="canonical_thread"):
        DVRGenerator(WEIGHTS, CFG, canonical_thread=1)


def test_passes_on_the_thread_run_in_the_callers_inference_mode():
    """Autograd modes are thread-local: built and run under inference_mode, the K/V are inference tensors,
    which the worker may only write inside inference mode too."""
    prompts, params = _requests(3, 6)
    reference, _ = _run_counting_overlap(_generator(thread=False), prompts, params)
    with torch.inference_mode():
        threaded, _ = _run_counting_overlap(_generator(thread=True), prompts, params)
    for p, a, b in zip(params, reference, threaded):
        if p.deterministic:
            assert (b.token_ids, b.logprobs) == (a.token_ids, a.logprobs)


class VerySlowCanonicalPolicy(FixedShapePolicy):
    def attention(self, *args, **kwargs):
        time.sleep(0.05)
        return super().attention(*args, **kwargs)


def test_a_step_with_nothing_to_launch_waits_only_briefly_so_new_requests_run_beside_the_pass():
    gen = DVRGenerator(WEIGHTS, CFG, window=4, group=2, kv_cache_tokens=4096,
                       canonical_policy=VerySlowCanonicalPolicy(), canonical_thread=True)
    det = gen.submit([1, 5, 9, 13, 17], SamplingParams(max_new_tokens=4, deterministic=True))
    _step_until_a_pass_is_running(gen)
    start = time.perf_counter()
    gen.step()  # nothing to launch: the det request is in the pass
    assert time.perf_counter() - start < 0.05  # it did not wait for the whole pass (>= 0.1 s: two layers)
    free = gen.submit([1, 7, 7, 7], SamplingParams(max_new_tokens=3, ignore_eos=True))
    while not gen.is_finished(free):
        in_flight = gen.passes.oldest
        assert in_flight is not None and not in_flight.is_ready(), "the free request waited for the pass"
        gen.step()
    assert len(gen.result(free).token_ids) == 3
    while gen.has_unfinished():
        gen.step()
    assert len(gen.result(det).token_ids) == 4


def test_an_interrupted_wait_returns_only_once_the_worker_is_done(monkeypatch):
    """^C while the host waits for a pass: the worker still writes the pass's K/V, so the interrupt is
    raised only after it has finished (the caller may then free those blocks)."""
    from concurrent.futures import ThreadPoolExecutor

    import llm42.verify.pass_result as pass_result
    from llm42.verify.pass_result import PassResult

    real_wait, calls = pass_result.concurrent.futures.wait, []

    def interrupted_once(futures, timeout=None):
        calls.append(timeout)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real_wait(futures, timeout=timeout)

    def slow_pass():
        time.sleep(0.1)
        return torch.zeros(2, dtype=torch.int64), torch.zeros(2), None

    with ThreadPoolExecutor(max_workers=1) as worker:
        future = worker.submit(slow_pass)
        result = PassResult(None, None, None, future=future)
        monkeypatch.setattr(pass_result.concurrent.futures, "wait", interrupted_once)
        with pytest.raises(KeyboardInterrupt):
            result.wait()
        assert future.done() and len(calls) == 2


class FailingCanonicalPolicy(FixedShapePolicy):
    def attention(self, *args, **kwargs):
        time.sleep(0.02)
        raise RuntimeError("injected fault on the worker thread")


def test_close_frees_everything_after_a_pass_that_failed_on_the_thread():
    gen = DVRGenerator(WEIGHTS, CFG, window=4, group=2, kv_cache_tokens=4096,
                       canonical_policy=FailingCanonicalPolicy(), canonical_thread=True)
    gen.submit([1, 5, 9, 13, 17], SamplingParams(max_new_tokens=4, deterministic=True))
    gen.step()  # launches the prompt's canonical pass, which raises on the thread
    assert gen.passes.oldest is not None
    kv = gen.kv
    gen.close()  # the pass's error is not close()'s: every request is aborted and freed all the same
    assert gen.is_closed and kv.num_used_blocks == 0
