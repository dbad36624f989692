"""``llm42 serve`` end to end: the real ``openai`` client against a server process on 127.0.0.1.

The server runs the embedded stories260K model (with a chat template added, for the chat
endpoint); references come from an in-process ``DVRGenerator`` over the same checkpoint and
canonical config, so "identical" means bit-identical to ``generate`` alone.
"""

from __future__ import annotations

import json
import random
import socket
import time
from dataclasses import replace

import pytest

httpx = pytest.importorskip("httpx", reason="the server tests need the dev extra (httpx, openai)")
openai = pytest.importorskip("openai", reason="the server tests need the dev extra (httpx, openai)")
pytest.importorskip("fastapi", reason="llm42 serve needs the serve extra (fastapi, uvicorn)")

from llm42 import DVRGenerator, SamplingParams
from llm42.params import sample_seed
from tests.server_process import ServerProcess, background_load, chat_checkpoint


WINDOW, GROUP = 4, 2
API_KEY = "test-key"
PROMPT = "Once upon a time"
# a deterministic sampled request: temperature, top-p and seed all matter
DET = {"temperature": 0.8, "top_p": 0.95, "seed": 7, "deterministic": True}
DET_PARAMS = SamplingParams(max_new_tokens=24, temperature=0.8, top_p=0.95, seed=7, deterministic=True, logprobs=True)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return chat_checkpoint(tmp_path_factory.mktemp("chat_stories260K"))


@pytest.fixture(scope="module")
def server(checkpoint):
    proc = ServerProcess("--model", str(checkpoint), "--window", str(WINDOW), "--group", str(GROUP),
                         "--served-model-name", "stories", api_key=API_KEY)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def reference_gen(checkpoint) -> DVRGenerator:
    return DVRGenerator.from_pretrained(checkpoint, window=WINDOW, group=GROUP)


def _complete(client, **kwargs):
    extra = {k: kwargs.pop(k) for k in ("deterministic", "top_k", "return_token_ids", "ignore_eos") if k in kwargs}
    return client.completions.create(model="stories", extra_body=extra, **kwargs)


def _tokens_and_logprobs(completion) -> tuple[list[int], list[float]]:
    choice = completion.choices[0]
    return choice.model_extra["token_ids"], choice.logprobs.token_logprobs


# -- the contract over HTTP -----------------------------------------------------------------------------
def test_deterministic_completion_is_identical_alone_and_under_concurrent_load(client, server, reference_gen):
    reference = reference_gen.generate([PROMPT], DET_PARAMS)[0]
    request = dict(prompt=PROMPT, max_tokens=24, logprobs=0, return_token_ids=True, **DET)
    alone = _complete(client, **request)
    assert _tokens_and_logprobs(alone) == (reference.token_ids, reference.logprobs)
    assert alone.choices[0].text == reference.text
    assert alone.system_fingerprint == f"llm42-0.1.0-w{WINDOW}g{GROUP}"

    clients = [openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
               for _ in range(4)]

    def fire(rng: random.Random, index: int) -> None:
        kwargs = dict(prompt=rng.choice(["The dog", "Lily saw a", "One day", [1, 403, 407, 2000 % 512]]),
                      max_tokens=rng.randint(1, 40), temperature=rng.choice([0.0, 0.7, 1.2]),
                      top_k=rng.choice([0, 20]), deterministic=rng.random() < 0.3)
        if rng.random() < 0.5:
            for _ in _complete(clients[index], stream=True, **kwargs):
                if rng.random() < 0.1:
                    break  # a client that goes away mid-stream
        else:
            _complete(clients[index], **kwargs)

    with background_load(fire, num_threads=len(clients)) as num_fired:
        under_load = [_complete(client, **request) for _ in range(3)]
        streamed = [chunk for chunk in _complete(client, stream=True, **request)]
    assert num_fired[0] > 3
    for completion in under_load:
        assert _tokens_and_logprobs(completion) == (reference.token_ids, reference.logprobs)
        assert completion.choices[0].text == reference.text
    assert [t for chunk in streamed for t in chunk.choices[0].model_extra["token_ids"]] == reference.token_ids
    assert [lp for chunk in streamed for lp in chunk.choices[0].logprobs.token_logprobs] == reference.logprobs
    assert server.wait_idle()["kv_used_blocks"] == 0


def test_chat_deterministic_answer_matches_generate_alone(client, reference_gen):
    messages = [{"role": "user", "content": "Tell me a story about a cat"}]
    reference = reference_gen.generate([messages], SamplingParams(max_new_tokens=20, deterministic=True))[0]
    answer = client.chat.completions.create(model="stories", messages=messages, max_tokens=20, temperature=0,
                                            extra_body={"deterministic": True, "return_token_ids": True})
    assert answer.choices[0].message.content == reference.text
    assert answer.choices[0].model_extra["token_ids"] == reference.token_ids
    assert answer.choices[0].finish_reason == reference.finish_reason
    assert answer.usage.completion_tokens == len(reference.token_ids)


# -- streaming == non-streaming -------------------------------------------------------------------------
@pytest.mark.parametrize("stop", [None, [" the", "."]])
def test_streaming_text_equals_non_streaming_text(client, stop):
    request = dict(prompt="Lily and Ben went to the park", max_tokens=48, stop=stop, **DET)
    whole = _complete(client, **request).choices[0]
    chunks = list(_complete(client, stream=True, **request))
    assert "".join(c.choices[0].text for c in chunks) == whole.text
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason
    if stop is not None:
        assert whole.finish_reason == "stop" and not any(s in whole.text for s in stop)


def test_chat_streaming_text_equals_non_streaming_text(client):
    request = dict(model="stories", messages=[{"role": "user", "content": "Hello"}], max_tokens=30,
                   extra_body={"deterministic": True}, temperature=0.9, seed=3)
    whole = client.chat.completions.create(**request).choices[0].message.content
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **request))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


# -- disconnects, bad input, limits ---------------------------------------------------------------------
def test_a_disconnect_mid_stream_aborts_and_frees_its_kv(server):
    before = server.wait_idle()
    body = {"model": "stories", "prompt": PROMPT, "max_tokens": 480, "stream": True, "ignore_eos": True,
            "deterministic": True, "temperature": 0}
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", f"{server.url}/v1/completions", json=body, headers=server.headers) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            assert json.loads(first[len("data: "):])["choices"][0]["finish_reason"] is None
            during = server.metrics()
            assert during["kv_used_blocks"] > 0
    after = server.wait_idle()
    assert after["kv_used_blocks"] == 0 and after["requests_pending"] == 0
    assert after["client_aborts_total"] == before["client_aborts_total"] + 1
    assert after["committed_tokens_total"] - before["committed_tokens_total"] < 480  # it did not run to the end


def test_a_disconnect_while_waiting_for_a_non_streamed_answer_aborts_it(server):
    before = server.wait_idle()
    body = {"model": "stories", "prompt": PROMPT, "max_tokens": 480, "ignore_eos": True, "deterministic": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/completions", json=body, headers=server.headers, timeout=0.3)
    after = server.wait_idle()
    assert after["kv_used_blocks"] == 0 and after["requests_pending"] == 0
    assert after["client_aborts_total"] == before["client_aborts_total"] + 1
    assert after["committed_tokens_total"] - before["committed_tokens_total"] < 480


def test_a_client_that_hangs_up_before_its_body_arrives_is_dropped_quietly(server):
    def count_499() -> float:
        text = httpx.get(f"{server.url}/metrics", timeout=10).text
        return sum(float(line.split()[-1]) for line in text.splitlines()
                   if line.startswith("llm42_http_requests_total{") and 'status="499"' in line)

    before = count_499()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {API_KEY}\r\nContent-Length: 200\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(head + b'{"prompt": "Once')  # 16 of the 200 bytes promised, then gone
    deadline = time.monotonic() + 30
    while count_499() == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert count_499() == before + 1
    assert server.wait_idle()["requests_pending"] == 0
    assert "Traceback" not in server.log()
    response = httpx.post(f"{server.url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 2},
                          headers=server.headers, timeout=30)
    assert response.status_code == 200  # the next client is served as usual


BAD_COMPLETION_FIELDS = [
    ("prompt", ""), ("prompt", []), ("prompt", 5), ("prompt", [1, "x"]), ("prompt", [1, 99999]),
    ("max_tokens", 0), ("max_tokens", "8"), ("max_tokens", True), ("max_tokens", 100000),
    ("temperature", -0.5), ("temperature", "hot"), ("top_p", 0), ("top_p", 1.5), ("top_k", -2), ("top_k", 1.5),
    ("seed", "x"), ("seed", 1.5), ("seed", True), ("stop", 5), ("stop", ["a", "b", "c", "d", "e"]), ("stop", [""]),
    ("n", 0), ("n", 1000), ("logprobs", 6), ("logprobs", -1), ("stream", "yes"), ("deterministic", "true"),
    ("deterministic", 1), ("presence_penalty", 0.5), ("echo", True), ("stream_options", {"include_usage": True}),
    ("stop_token_ids", [-1]), ("ignore_eos", "no"), ("model", 7), ("deterministc", True),
]


@pytest.mark.parametrize(("field", "value"), BAD_COMPLETION_FIELDS)
def test_each_bad_completion_field_is_a_400_naming_it(server, field, value):
    body = {"model": "stories", "prompt": PROMPT, "max_tokens": 4, field: value}
    response = httpx.post(f"{server.url}/v1/completions", json=body, headers=server.headers, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == field and field in error["message"]
    assert error["type"] == "invalid_request_error"


BAD_CHAT_FIELDS = [
    ("messages", []), ("messages", "hi"), ("messages", [{"role": "user"}]), ("messages", [{"content": "x"}]),
    ("messages", [{"role": "user", "content": [{"type": "image_url"}]}]), ("top_logprobs", 3),
    ("max_completion_tokens", 0), ("tools", [{"type": "function"}]), ("logprobs", 1),
]


@pytest.mark.parametrize(("field", "value"), BAD_CHAT_FIELDS)
def test_each_bad_chat_field_is_a_400_naming_it(server, field, value):
    body = {"model": "stories", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, field: value}
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=server.headers, timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == field


def test_the_openai_client_sees_a_bad_request_error_naming_the_field(client):
    with pytest.raises(openai.BadRequestError) as info:
        _complete(client, prompt=PROMPT, max_tokens=4, top_p=2.0)
    assert info.value.body["param"] == "top_p"
    assert info.value.status_code == 400


def test_a_bad_request_leaves_the_others_untouched(client, reference_gen):
    reference = reference_gen.generate([PROMPT], DET_PARAMS)[0]
    with pytest.raises(openai.BadRequestError):
        _complete(client, prompt=[PROMPT, ""], max_tokens=24, **DET)  # the batch stands or falls together
    again = _complete(client, prompt=PROMPT, max_tokens=24, logprobs=0, return_token_ids=True, **DET)
    assert _tokens_and_logprobs(again) == (reference.token_ids, reference.logprobs)


def test_malformed_and_oversized_bodies(server):
    post = lambda content: httpx.post(f"{server.url}/v1/completions", content=content,  # noqa: E731
                                      headers={**server.headers, "Content-Type": "application/json"}, timeout=30)
    response = post(b"{not json")
    assert response.status_code == 400 and "JSON" in response.json()["error"]["message"]
    assert post(b"[1, 2]").status_code == 400
    huge = json.dumps({"prompt": "a" * (2 << 20), "max_tokens": 1}).encode()
    response = post(huge)
    assert response.status_code == 413 and "limit" in response.json()["error"]["message"]


def test_a_prompt_longer_than_the_context_is_a_400(server):
    body = {"prompt": " ".join(["cat"] * 900), "max_tokens": 4}
    response = httpx.post(f"{server.url}/v1/completions", json=body, headers=server.headers, timeout=30)
    assert response.status_code == 400 and response.json()["error"]["param"] == "prompt"


def test_requests_without_the_api_key_get_401(server):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
        response = httpx.post(f"{server.url}/v1/completions", json={"prompt": PROMPT}, headers=headers, timeout=30)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(f"{server.url}/v1/models", timeout=30).status_code == 401
    assert httpx.get(f"{server.url}/health", timeout=30).status_code == 200  # probes need no key


def test_models_health_and_metrics(client, server, reference_gen):
    assert [m.id for m in client.models.list().data] == ["stories"]
    models = httpx.get(f"{server.url}/v1/models", headers=server.headers, timeout=30).json()
    assert models["data"][0]["max_model_len"] == reference_gen.max_model_len
    _complete(client, prompt=PROMPT, max_tokens=2)  # the counter below needs an answered completion: our own
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    for name in ("http_requests_total", "committed_tokens_total", "rollbacks_total", "canonical_passes_total",
                 "queue_depth", "kv_used_blocks", "kv_usage_ratio"):
        assert f"# TYPE llm42_{name} " in text
    assert 'llm42_http_requests_total{endpoint="/v1/completions",status="200"}' in text


# -- a small server: the bounded queue and graceful shutdown --------------------------------------------
def test_a_full_queue_answers_429_and_shutdown_ends_in_flight_requests():
    server = ServerProcess("--window", str(WINDOW), "--group", str(GROUP), "--max-pending", "2",
                           "--shutdown-timeout", "0.5")
    # deterministic: canonical passes make each reply take seconds on a CPU (2.5 s for the two here, against 0.7 s
    # free), so both are still running when the 0.5 s drain ends (free replies of 480 tokens finished inside a 1 s
    # drain on a fast machine: "length", not "abort")
    body = {"prompt": PROMPT, "max_tokens": 480, "ignore_eos": True, "stream": True, "deterministic": True}
    try:
        with httpx.Client(timeout=60) as http:
            streams = [http.stream("POST", f"{server.url}/v1/completions", json=body) for _ in range(2)]
            responses = [s.__enter__() for s in streams]
            assert [r.status_code for r in responses] == [200, 200]
            lines = [r.iter_lines() for r in responses]
            for it in lines:
                next(it)  # both are running
            full = http.post(f"{server.url}/v1/completions", json={**body, "stream": False})
            assert full.status_code == 429 and full.json()["error"]["type"] == "rate_limit_error"
            server.process.terminate()  # graceful: the in-flight streams end, then everything is freed
            rest = [list(it) for it in lines]
            for s in streams:
                s.__exit__(None, None, None)
        for lines_left in rest:
            events = [line for line in lines_left if line.startswith("data: ")]
            assert events[-1] == "data: [DONE]"
            assert json.loads(events[-2][len("data: "):])["choices"][0]["finish_reason"] == "abort"
        assert server.process.wait(60) is not None
    finally:
        server.stop()
    assert "Traceback" not in server.output


# -- n samples and log-probs ----------------------------------------------------------------------------
def test_n_samples_are_different_and_each_reproducible(client, reference_gen):
    request = dict(prompt=PROMPT, max_tokens=16, n=4, temperature=1.0, seed=11, deterministic=True,
                   return_token_ids=True)
    first = _complete(client, **request)
    samples = [c.model_extra["token_ids"] for c in sorted(first.choices, key=lambda c: c.index)]
    assert [c.index for c in first.choices] == [0, 1, 2, 3]
    assert len({tuple(s) for s in samples}) == 4  # one seed per sample: no two alike
    again = _complete(client, **request)
    assert [c.model_extra["token_ids"] for c in again.choices] == samples
    # sample i is generate() of the same request with n=4, and alone with the documented per-sample seed
    params = SamplingParams(max_new_tokens=16, temperature=1.0, seed=11, deterministic=True)
    assert [c.token_ids for c in reference_gen.generate([PROMPT], replace(params, n=4))] == samples
    for i, sample in enumerate(samples):
        alone = reference_gen.generate([PROMPT], replace(params, seed=sample_seed(11, i)))[0]
        assert alone.token_ids == sample
    streamed = [[] for _ in range(4)]
    for chunk in _complete(client, stream=True, **request):
        for choice in chunk.choices:
            streamed[choice.index] += choice.model_extra.get("token_ids") or []
    assert streamed == samples


def test_logprobs_come_back_as_openai_returns_them(client, reference_gen):
    reference = reference_gen.generate([PROMPT], replace(DET_PARAMS, logprobs=3))[0]
    completion = _complete(client, prompt=PROMPT, max_tokens=24, logprobs=3, **DET).choices[0]
    assert completion.logprobs.token_logprobs == reference.logprobs
    assert len(completion.logprobs.tokens) == len(reference.token_ids)
    assert [list(top.values()) for top in completion.logprobs.top_logprobs] == \
        [list(top.values()) for top in reference.top_logprobs]
    assert completion.logprobs.text_offset[0] == 0

    chat = client.chat.completions.create(model="stories", messages=[{"role": "user", "content": "Hi"}],
                                          max_tokens=8, logprobs=True, top_logprobs=2, temperature=0,
                                          extra_body={"deterministic": True}).choices[0]
    assert len(chat.logprobs.content) == 8 or chat.finish_reason == "stop"
    for entry in chat.logprobs.content:
        assert len(entry.top_logprobs) == 2 and entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
        assert entry.bytes == list(entry.token.encode())
