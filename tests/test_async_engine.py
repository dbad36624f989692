"""AsyncEngine: one engine loop owns the generator; clients on many threads and event loops stay exact.

Also the server's TextStream (committed tokens -> text deltas with stop sequences).
"""

from __future__ import annotations

import asyncio
import random
import threading

import pytest

pytest.importorskip("fastapi", reason="llm42.server (its text streams) needs the serve extra")

from llm42 import AsyncEngine, DVRGenerator, EngineClosedError, EngineFullError, SamplingParams
from llm42.async_engine import EngineStepError
from llm42.server.detokenizer import TextStream

WINDOW, GROUP = 4, 2


@pytest.fixture(scope="module")
def reference_gen() -> DVRGenerator:
    return DVRGenerator.from_pretrained(window=WINDOW, group=GROUP)


def _engine(**kwargs) -> AsyncEngine:
    return AsyncEngine(DVRGenerator.from_pretrained(window=WINDOW, group=GROUP), **kwargs)


async def _collect(stream) -> list[int]:
    tokens = []
    async for output in stream:
        tokens += output.token_ids
    return tokens


def test_clients_on_many_threads_get_every_token_and_deterministic_outputs_equal_alone_runs(reference_gen):
    rng = random.Random(0)
    requests = [([1] + [rng.randrange(3, 512) for _ in range(rng.randint(1, 10))],
                 SamplingParams(max_new_tokens=rng.randint(2, 20), temperature=rng.choice([0.0, 0.9]), seed=i,
                                deterministic=i % 2 == 0, logprobs=True))
                for i in range(24)]
    references = [reference_gen.generate([p], params)[0] for p, params in requests]
    results: dict[int, tuple] = {}
    with _engine() as engine:
        def client(indices: list[int]) -> None:
            async def run() -> None:
                streams = {i: engine.submit(*requests[i]) for i in indices}
                for i, stream in streams.items():
                    outputs = [o async for o in stream]
                    results[i] = ([t for o in outputs for t in o.token_ids],
                                  [lp for o in outputs for lp in o.logprobs], stream.completion)
            asyncio.run(run())

        threads = [threading.Thread(target=client, args=(list(range(k, 24, 4)),)) for k in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert engine.num_pending == 0
    for i, reference in enumerate(references):
        tokens, logprobs, completion = results[i]
        assert tokens == completion.token_ids and logprobs == completion.logprobs  # nothing lost on the way
        if requests[i][1].deterministic:
            assert tokens == reference.token_ids and logprobs == reference.logprobs


def test_abort_ends_the_stream_keeps_committed_tokens_and_frees_kv():
    async def run(engine: AsyncEngine):
        stream = engine.submit([1, 400, 401], SamplingParams(max_new_tokens=400, ignore_eos=True))
        received = []
        async for output in stream:
            received += output.token_ids
            if len(received) >= 3:
                stream.abort()
        return received, stream.completion

    with _engine() as engine:
        received, completion = asyncio.run(run(engine))
        assert completion.finish_reason == "abort"
        assert completion.token_ids == received and 3 <= len(received) < 400
        assert engine.generator.kv.num_used_blocks == 0
        assert not engine.generator.has_unfinished()


def test_bad_input_is_raised_by_the_stream_and_a_group_stands_or_falls_together():
    async def run(engine: AsyncEngine):
        good, bad = engine.submit_all([[1, 2, 3], []], [SamplingParams(max_new_tokens=4)] * 2)
        with pytest.raises(ValueError, match="prompt is empty"):
            await good.accepted()
        with pytest.raises(ValueError, match="prompt is empty"):
            await _collect(bad)
        with pytest.raises(ValueError):
            engine.submit([1], SamplingParams(n=2))  # n samples: submit_all
        return await _collect(engine.submit([1, 2, 3], SamplingParams(max_new_tokens=4, ignore_eos=True)))

    with _engine() as engine:
        assert len(asyncio.run(run(engine))) == 4
        assert engine.generator.num_running == engine.generator.num_waiting == 0


def test_a_full_engine_refuses_and_a_closed_one_refuses_and_ends_its_streams():
    async def run(engine: AsyncEngine):
        params = SamplingParams(max_new_tokens=400, ignore_eos=True)
        streams = [engine.submit([1, 5], params) for _ in range(2)]
        with pytest.raises(EngineFullError):
            engine.submit([1, 5], params)
        await asyncio.gather(*(s.accepted() for s in streams))
        await asyncio.to_thread(engine.close)
        with pytest.raises(EngineClosedError):
            engine.submit([1, 5], params)
        return [await s.result() for s in streams]

    engine = _engine(max_pending=2)
    completions = asyncio.run(run(engine))
    assert [c.finish_reason for c in completions] == ["abort", "abort"]
    assert engine.generator.is_closed and not engine.is_running


def test_steps_that_keep_failing_fail_the_in_flight_streams_and_the_loop_survives(monkeypatch):
    engine = _engine(max_step_failures=2)
    gen = engine.generator
    real_step = gen.step
    failures = {"left": 2}

    def failing_step():
        if failures["left"]:
            failures["left"] -= 1
            raise RuntimeError("injected")
        return real_step()

    async def run():
        monkeypatch.setattr(gen, "step", failing_step)
        stream = engine.submit([1, 5, 6], SamplingParams(max_new_tokens=5))
        with pytest.raises(EngineStepError, match="injected"):
            await _collect(stream)
        return await _collect(engine.submit([1, 5, 6], SamplingParams(max_new_tokens=5, ignore_eos=True)))

    with engine:
        assert len(asyncio.run(run())) == 5  # the loop went on serving
        assert gen.kv.num_used_blocks == 0


# -- TextStream ---------------------------------------------------------------------------------------
def test_text_stream_deltas_join_to_the_decoded_text(reference_gen):
    tokenizer = reference_gen.tokenizer
    ids = reference_gen.generate(["Once upon a time"], SamplingParams(max_new_tokens=40, ignore_eos=True))[0].token_ids
    stream = TextStream(tokenizer)
    text = "".join(stream.add([t]) for t in ids) + stream.finish()
    assert text == tokenizer.decode(ids, skip_special_tokens=True)
    chunked = TextStream(tokenizer)
    assert "".join(chunked.add(ids[i:i + 3]) for i in range(0, len(ids), 3)) + chunked.finish() == text


def test_text_stream_stops_before_a_stop_sequence_split_across_tokens(reference_gen):
    tokenizer = reference_gen.tokenizer
    ids = tokenizer("Lily went to the park and she saw a dog", add_special_tokens=False)["input_ids"]
    stream = TextStream(tokenizer, stop=("park and",))
    deltas = [stream.add([t]) for t in ids]
    assert "".join(deltas) + stream.finish() == "Lily went to the "
    assert stream.is_stopped and stream.num_tokens < len(ids)
    assert all("park" not in d for d in deltas)
    unstopped = TextStream(tokenizer, stop=("park and cat",))  # a prefix that never completes is released
    assert "".join(unstopped.add([t]) for t in ids) + unstopped.finish() == tokenizer.decode(ids)
