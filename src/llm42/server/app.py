"""The OpenAI-compatible FastAPI app over an ``AsyncEngine``.

Every answer holds committed tokens only, so a ``deterministic: true`` request
gets the same tokens, text and log-probs over HTTP as ``DVRGenerator.generate``
gives it alone, whatever else the server is doing. Streaming and non-streaming
answers are built by the same code (``_Choice``), so they carry the same text.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.requests import ClientDisconnect

from llm42 import __version__
from llm42.async_engine import AsyncEngine, EngineClosedError, EngineFullError, EngineStepError, Output, RequestStream
from llm42.prompts import encode_prompt
from llm42.server.detokenizer import TextStream
from llm42.server.metrics import ServerMetrics
from llm42.server.protocol import APIError, GenerationRequest, Limits, parse_chat, parse_completion

__all__ = ["build_app"]

_log = logging.getLogger("llm42.server")
_ENDPOINTS = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics")


def _error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status)


class _Gate:
    """ASGI middleware: the API key on /v1/*, and a count of every answer by endpoint and status."""

    def __init__(self, app, *, api_key: str | None, metrics: ServerMetrics):
        self.app = app
        self.expected = None if api_key is None else f"Bearer {api_key}".encode()
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        endpoint = path if path in _ENDPOINTS else "other"

        async def counting_send(message):
            if message["type"] == "http.response.start":
                self.metrics.count_request(endpoint, message["status"])
            await send(message)

        if self.expected is not None and path.startswith("/v1/"):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                error = APIError(401, "Incorrect API key provided (send Authorization: Bearer KEY)",
                                 code="invalid_api_key")
                return await _error_response(error)(scope, receive, counting_send)
        await self.app(scope, receive, counting_send)


async def _read_json(request: Request, max_bytes: int):
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > max_bytes:
        raise APIError(413, f"the request body ({length} bytes) exceeds the limit of {max_bytes} bytes")
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > max_bytes:
                raise APIError(413, f"the request body exceeds the limit of {max_bytes} bytes")
    except ClientDisconnect:
        raise _ClientGone() from None
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise APIError(400, f"the request body is not valid JSON: {exc}") from None


class _ClientGone(Exception):
    """The client hung up before its request body arrived: nothing was queued, nothing is owed."""


async def _wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


@dataclass(frozen=True)
class _Tokens:
    """Committed tokens with their log-probs and (with logprobs=N) top alternatives."""

    ids: list[int]
    logprobs: list[float]
    top_logprobs: list[dict[int, float]]


_NO_TOKENS = _Tokens([], [], [])


class _Choice:
    """One answer (a prompt's sample): its stream, text so far, tokens and log-probs."""

    def __init__(self, index: int, stream: RequestStream, text: TextStream):
        self.index = index
        self.stream = stream
        self.text = text
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.top_logprobs: list[dict[int, float]] = []
        self.finish_reason: str | None = None

    def add(self, output: Output) -> tuple[str, _Tokens]:
        """The text delta and the tokens ``output`` adds (nothing after a stop sequence)."""
        before = self.text.num_tokens
        delta = self.text.add(output.token_ids)
        num_new = self.text.num_tokens - before
        tokens = _Tokens(list(output.token_ids[:num_new]), list((output.logprobs or ())[:num_new]),
                         list((output.top_logprobs or ())[:num_new]))
        self.token_ids += tokens.ids
        self.logprobs += tokens.logprobs
        self.top_logprobs += tokens.top_logprobs
        if self.text.is_stopped:
            self.finish_reason = "stop"
            self.stream.abort()
        return delta, tokens

    @property
    def tokens(self) -> _Tokens:
        return _Tokens(self.token_ids, self.logprobs, self.top_logprobs)

    def end(self) -> str:
        """The held-back rest of the text; sets ``finish_reason``."""
        if self.finish_reason is None:
            self.finish_reason = self.stream.completion.finish_reason
        return self.text.finish()


async def _outputs(choices: Sequence[_Choice]) -> AsyncIterator[tuple[_Choice, Output | None]]:
    """Each choice's outputs as they commit, then (choice, None) when it ends; aborts the rest on exit."""
    items: asyncio.Queue = asyncio.Queue()

    async def pump(choice: _Choice) -> None:
        try:
            async for output in choice.stream:
                items.put_nowait((choice, output))
            items.put_nowait((choice, None))
        except BaseException as exc:  # noqa: BLE001 - re-raised by the consumer
            items.put_nowait((choice, exc))

    tasks = [asyncio.ensure_future(pump(c)) for c in choices]
    try:
        num_open = len(choices)
        while num_open:
            choice, item = await items.get()
            if isinstance(item, BaseException):
                raise item
            if item is None:
                num_open -= 1
            yield choice, item
    finally:
        for choice in choices:
            if choice.stream.completion is None:
                choice.stream.abort()
        for task in tasks:
            task.cancel()


class _Server:
    """The handlers' shared state: the engine, the model's facts, limits and metrics."""

    def __init__(self, engine: AsyncEngine, *, model_name: str, limits: Limits, metrics: ServerMetrics):
        gen = engine.generator
        self.engine = engine
        self.model_name = model_name
        self.tokenizer = gen.tokenizer
        self.vocab_size = gen.cfg.vocab_size
        self.context = gen.max_model_len
        self.limits = limits
        self.metrics = metrics
        config = gen.canonical_config
        # the canonical config is part of what determines a deterministic answer
        self.fingerprint = f"llm42-{__version__}-w{config.window}g{config.group}"

    # -- request -> engine ---------------------------------------------------------------------
    def _encode(self, req: GenerationRequest) -> list[list[int]]:
        field_name = "messages" if req.kind == "chat" else "prompt"
        encoded = []
        for prompt in req.prompts:
            try:
                ids = encode_prompt(self.tokenizer, prompt, self.vocab_size)
            except (ValueError, TypeError) as exc:
                raise APIError(400, f"{field_name}: {exc}", param=field_name) from None
            max_prompt = min(self.limits.max_prompt_tokens or self.context, self.context - 1)
            if len(ids) > max_prompt:
                raise APIError(400, f"{field_name}: the prompt has {len(ids)} tokens, more than the limit of "
                                    f"{max_prompt}", param=field_name)
            encoded.append(ids)
        return encoded

    def _params_for(self, req: GenerationRequest, ids: list[int]):
        max_tokens = req.max_tokens
        if max_tokens is None:  # chat without a limit: the rest of the context
            max_tokens = self.context - len(ids)
            if self.limits.max_tokens is not None:
                max_tokens = min(max_tokens, self.limits.max_tokens)
        if len(ids) + max_tokens > self.context:
            raise APIError(400, f"max_tokens: this model's maximum context length is {self.context} tokens, but "
                                f"{len(ids) + max_tokens} were requested ({len(ids)} in the prompt, {max_tokens} for "
                                "the completion)", param="max_tokens")
        # n samples, each seeded by the engine from ``seed`` (llm42.params.sample_seed)
        logprobs = False if req.logprobs is None else (req.logprobs or True)
        return replace(req.params, max_new_tokens=max_tokens, n=req.n, logprobs=logprobs)

    async def start(self, req: GenerationRequest) -> tuple[list[list[int]], list[_Choice]]:
        """Validate, encode and submit every sample of every prompt (all or none); the choices."""
        encoded = await asyncio.to_thread(self._encode, req)
        params = [self._params_for(req, ids) for ids in encoded]
        try:
            streams = self.engine.submit_all(encoded, params)
        except EngineFullError as exc:
            raise APIError(429, f"the server is busy: {exc}; retry later", type="rate_limit_error") from None
        except EngineClosedError as exc:
            raise APIError(503, f"the server is not accepting requests: {exc}", type="server_error") from None
        try:
            await asyncio.gather(*(s.accepted() for s in streams))
        except (ValueError, TypeError) as exc:  # the generator's own checks (e.g. the K/V store's size)
            raise APIError(400, str(exc), param=_param_of(exc, req.kind)) from None
        except EngineClosedError as exc:
            raise APIError(503, f"the server is not accepting requests: {exc}", type="server_error") from None
        self.metrics.prompt_tokens += sum(map(len, encoded))
        choices = [_Choice(i, s, TextStream(self.tokenizer, req.stop)) for i, s in enumerate(streams)]
        return encoded, choices

    # -- answers ----------------------------------------------------------------------------------
    def _token_text(self, token: int) -> str:
        return "" if self.tokenizer is None else self.tokenizer.decode([token])

    def logprobs_body(self, req: GenerationRequest, tokens: _Tokens, offset: int):
        """``logprobs`` as OpenAI returns it: chat's ``content`` list, or the completions' four arrays."""
        if req.logprobs is None:
            return None
        texts = [self._token_text(t) for t in tokens.ids]
        tops = tokens.top_logprobs or [{} for _ in texts]
        if req.kind == "chat":
            return {"content": [
                {"token": text, "logprob": lp, "bytes": list(text.encode()),
                 "top_logprobs": [{"token": self._token_text(t), "logprob": v, "bytes": list(self._token_text(t).encode())}
                                  for t, v in top.items()]}
                for text, lp, top in zip(texts, tokens.logprobs, tops)]}
        offsets, position = [], offset
        for text in texts:
            offsets.append(position)
            position += len(text)
        top_logprobs = [{self._token_text(t): v for t, v in top.items()} for top in tops] if req.logprobs else None
        return {"tokens": texts, "token_logprobs": tokens.logprobs, "top_logprobs": top_logprobs,
                "text_offset": offsets}

    def usage(self, encoded: list[list[int]], choices: Sequence[_Choice]) -> dict:
        prompt_tokens = sum(map(len, encoded))
        completion_tokens = sum(len(c.token_ids) for c in choices)
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens}

    def header(self, req: GenerationRequest, *, is_chunk: bool) -> dict:
        kind = ("chat.completion.chunk" if is_chunk else "chat.completion") if req.kind == "chat" else "text_completion"
        prefix = "chatcmpl" if req.kind == "chat" else "cmpl"
        return {"id": f"{prefix}-{uuid.uuid4().hex}", "object": kind, "created": int(time.time()),
                "model": self.model_name, "system_fingerprint": self.fingerprint}

    async def answer(self, request: Request, req: GenerationRequest) -> Response:
        encoded, choices = await self.start(req)
        if req.stream:
            # the background task runs when the response ends, also when the client disconnected
            return StreamingResponse(self._sse(req, encoded, choices), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"},
                                     background=BackgroundTask(self._abort_unfinished, choices))
        collect = asyncio.ensure_future(self._collect(choices))
        disconnect = asyncio.ensure_future(_wait_for_disconnect(request))
        try:
            await asyncio.wait({collect, disconnect}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            disconnect.cancel()
        if not collect.done():  # the client went away: abort its requests (``_outputs`` does, on cancel)
            collect.cancel()
            self.metrics.client_aborts += 1
            return Response(status_code=499)
        try:
            texts = collect.result()
        except EngineStepError as exc:
            raise APIError(500, str(exc), type="server_error") from None
        header = self.header(req, is_chunk=False)
        body_choices = []
        for choice, text in zip(choices, texts):
            logprobs = self.logprobs_body(req, choice.tokens, 0)
            if req.kind == "chat":
                entry = {"index": choice.index, "message": {"role": "assistant", "content": text},
                         "logprobs": logprobs, "finish_reason": choice.finish_reason}
            else:
                entry = {"index": choice.index, "text": text, "logprobs": logprobs,
                         "finish_reason": choice.finish_reason}
            if req.return_token_ids:
                entry["token_ids"] = choice.token_ids
                entry["prompt_token_ids"] = encoded[choice.index // req.n]
            body_choices.append(entry)
        self.metrics.completion_tokens += sum(len(c.token_ids) for c in choices)
        return JSONResponse({**header, "choices": body_choices, "usage": self.usage(encoded, choices)})

    async def _abort_unfinished(self, choices: Sequence[_Choice]) -> None:
        unfinished = [c for c in choices if c.finish_reason is None]
        for choice in unfinished:
            choice.stream.abort()
        if unfinished:
            self.metrics.client_aborts += 1

    async def _collect(self, choices: Sequence[_Choice]) -> list[str]:
        texts = [""] * len(choices)
        async for choice, output in _outputs(choices):
            if output is None:
                texts[choice.index] += choice.end()
            else:
                texts[choice.index] += choice.add(output)[0]
        return texts

    async def _sse(self, req: GenerationRequest, encoded, choices: Sequence[_Choice]) -> AsyncIterator[str]:
        header = self.header(req, is_chunk=True)
        usage_field = {"usage": None} if req.include_usage else {}
        offsets = [0] * len(choices)

        def event(entries: list[dict], **extra) -> str:
            return f"data: {json.dumps({**header, 'choices': entries, **usage_field, **extra})}\n\n"

        def entry(choice: _Choice, text: str, tokens: _Tokens, finish_reason, *, is_first: bool = False) -> dict:
            body = {"index": choice.index}
            if req.kind == "chat":
                delta = {"role": "assistant", "content": text} if is_first else ({"content": text} if text else {})
                body["delta"] = delta
            else:
                body["text"] = text
            body["logprobs"] = self.logprobs_body(req, tokens, offsets[choice.index])
            body["finish_reason"] = finish_reason
            if req.return_token_ids:
                body["token_ids"] = tokens.ids
            offsets[choice.index] += len(text)
            return body

        try:
            if req.kind == "chat":
                yield event([entry(c, "", _NO_TOKENS, None, is_first=True) for c in choices])
            async for choice, output in _outputs(choices):
                if output is None:
                    rest = choice.end()
                    yield event([entry(choice, rest, _NO_TOKENS, choice.finish_reason)])
                    continue
                text, tokens = choice.add(output)
                if text or (tokens.ids and (req.logprobs is not None or req.return_token_ids)):
                    yield event([entry(choice, text, tokens, None)])
            self.metrics.completion_tokens += sum(len(c.token_ids) for c in choices)
            if req.include_usage:
                yield event([], usage=self.usage(encoded, choices))
            yield "data: [DONE]\n\n"
        except EngineStepError as exc:
            error = APIError(500, str(exc), type="server_error")
            yield f"data: {json.dumps(error.body())}\n\n"


def _param_of(exc: Exception, kind: str) -> str | None:
    message = str(exc)
    if "max_new_tokens" in message:
        return "max_tokens"
    if message.startswith("prompt"):
        return "messages" if kind == "chat" else "prompt"
    return None


def build_app(engine: AsyncEngine, *, model_name: str, api_key: str | None = None, limits: Limits | None = None,
              drain_timeout: float = 0.0) -> FastAPI:
    """The ASGI app serving ``engine``. On shutdown it closes the engine: requests still in flight after
    ``drain_timeout`` seconds are aborted and everything they hold is freed."""
    limits = Limits() if limits is None else limits
    metrics = ServerMetrics()
    server = _Server(engine, model_name=model_name, limits=limits, metrics=metrics)

    @asynccontextmanager
    async def lifespan(_app):
        yield
        await asyncio.to_thread(engine.close, drain_timeout=drain_timeout)

    app = FastAPI(title="llm42", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.llm42 = server

    @app.exception_handler(APIError)
    async def api_error(_request: Request, exc: APIError) -> JSONResponse:
        return _error_response(exc)

    @app.exception_handler(_ClientGone)
    async def client_gone(_request: Request, _exc: _ClientGone) -> Response:
        # nginx's "client closed request": uvicorn drops the answer, /metrics counts it under status 499
        return Response(status_code=499)

    @app.get("/health")
    async def health() -> Response:
        if engine.is_running:
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "unavailable"}, status_code=503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return PlainTextResponse(metrics.render(engine.snapshot), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models() -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": model_name, "object": "model", "created": 0, "owned_by": "llm42", "max_model_len": server.context},
        ]})

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await _read_json(request, limits.max_body_bytes)
        return await server.answer(request, parse_completion(body, limits))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = await _read_json(request, limits.max_body_bytes)
        return await server.answer(request, parse_chat(body, limits))

    app.add_middleware(_Gate, api_key=api_key, metrics=metrics)
    return app
