"""The OpenAI request bodies ``llm42 serve`` accepts, validated field by field.

``parse_completion`` and ``parse_chat`` turn a decoded JSON body into a
``GenerationRequest`` or raise ``APIError`` (HTTP 400 with an OpenAI-style error
body whose ``param`` names the bad field). Nothing here touches the engine, so a
bad request is refused before any work starts.

Fields: the OpenAI ones (``model``, ``prompt``/``messages``, ``max_tokens``,
``max_completion_tokens``, ``temperature``, ``top_p``, ``seed``, ``stop``, ``n``,
``logprobs``, ``top_logprobs``, ``stream``, ``stream_options``, ``user``, and the
penalties / ``logit_bias`` / ``best_of`` / ``echo`` / ``suffix`` at their no-op
values) plus llm42's ``deterministic`` and ``top_k``, and vLLM's
``stop_token_ids``, ``ignore_eos`` and ``return_token_ids``. An unknown field is
refused, as OpenAI does, so a misspelt ``deterministic`` cannot silently give a
non-reproducible answer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from llm42.params import SamplingParams

__all__ = ["APIError", "Limits", "GenerationRequest", "parse_completion", "parse_chat"]

# OpenAI's caps: 5 alternatives per token for completions, 20 for chat, 4 stop sequences
MAX_COMPLETION_LOGPROBS = 5
MAX_CHAT_TOP_LOGPROBS = 20
MAX_STOP_SEQUENCES = 4
DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


class APIError(Exception):
    """An error answered with ``status`` and OpenAI's error body."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 type: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.type = type
        self.code = code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def _bad(param: str, message: str) -> APIError:
    return APIError(400, f"{param}: {message}", param=param)


@dataclass(frozen=True)
class Limits:
    """Request size limits, enforced before any work (400, or 413 for the body).

    ``max_prompt_tokens`` / ``max_tokens`` left None: the model's context bounds them.
    """

    max_body_bytes: int = 1 << 20
    max_n: int = 16
    max_prompts: int = 64
    max_prompt_tokens: int | None = None
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_n", "max_prompts", "max_prompt_tokens", "max_tokens"):
            value = getattr(self, name)
            if value is None and name in ("max_prompt_tokens", "max_tokens"):
                continue
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"Limits.{name} must be an int, got {type(value).__name__}")
            if value < 1:
                raise ValueError(f"Limits.{name} must be >= 1, got {value}")


@dataclass(frozen=True)
class GenerationRequest:
    """One validated request: its prompts, the shared sampling params, and how to answer."""

    kind: Literal["completion", "chat"]
    model: str | None
    prompts: tuple  # completion: str or list[int] each; chat: one list of messages
    params: SamplingParams  # for chat without max_tokens, max_new_tokens is set per prompt (the rest of the context)
    max_tokens: int | None  # None: chat without max_tokens (the rest of the context)
    n: int
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    logprobs: int | None  # None = off; N = the chosen token plus N alternatives
    return_token_ids: bool


# -- field readers -------------------------------------------------------------------------------
def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(body: Mapping, name: str, default, *, minimum: int | None = None, maximum: int | None = None):
    value = body.get(name)
    if value is None:
        return default
    if not _is_int(value):
        raise _bad(name, f"must be an integer, got {_kind(value)}")
    if minimum is not None and value < minimum:
        raise _bad(name, f"must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise _bad(name, f"must be <= {maximum}, got {value}")
    return value


def _number(body: Mapping, name: str, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise _bad(name, f"must be a number, got {_kind(value)}")
    if math.isnan(value) or math.isinf(value):
        raise _bad(name, f"must be finite, got {value}")
    return float(value)


def _bool(body: Mapping, name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _bad(name, f"must be a boolean, got {_kind(value)}")
    return value


def _kind(value) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
            dict: "an object"}.get(type(value), type(value).__name__)


def _no_op(body: Mapping, name: str, is_no_op) -> None:
    value = body.get(name)
    if value is not None and not is_no_op(value):
        raise _bad(name, f"is not supported (only its default); got {value!r}")


def _check_fields(body, allowed: frozenset[str]) -> None:
    if not isinstance(body, Mapping):
        raise APIError(400, f"the request body must be a JSON object, got {_kind(body)}")
    for name in body:
        if name not in allowed:
            raise APIError(400, f"Unrecognized request argument supplied: {name}", param=name)


def _stop(body: Mapping) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise _bad("stop", f"must be a string or an array of strings, got {_kind(value)}")
    if len(stops) > MAX_STOP_SEQUENCES:
        raise _bad("stop", f"at most {MAX_STOP_SEQUENCES} sequences, got {len(stops)}")
    if any(s == "" for s in stops):
        raise _bad("stop", "sequences must not be empty")
    return tuple(stops)


def _stop_token_ids(body: Mapping) -> tuple[int, ...]:
    value = body.get("stop_token_ids")
    if value is None:
        return ()
    if not isinstance(value, list) or not all(_is_int(t) and t >= 0 for t in value):
        raise _bad("stop_token_ids", "must be an array of non-negative integers")
    return tuple(value)


def _top_k(body: Mapping) -> int:
    top_k = _int(body, "top_k", 0, minimum=-1)
    return 0 if top_k == -1 else top_k  # -1 means off, as in vLLM


def _sampling(body: Mapping, *, max_tokens: int | None, logprobs: bool) -> SamplingParams:
    temperature = _number(body, "temperature", 1.0)
    if temperature < 0:
        raise _bad("temperature", f"must be >= 0, got {temperature}")
    top_p = _number(body, "top_p", 1.0)
    if not 0.0 < top_p <= 1.0:
        raise _bad("top_p", f"must be in (0, 1], got {top_p}")
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise _bad("seed", f"must be an integer, got {_kind(seed)}")
    return SamplingParams(
        max_new_tokens=1 if max_tokens is None else max_tokens,
        temperature=temperature,
        top_k=_top_k(body),
        top_p=top_p,
        seed=seed,
        deterministic=_bool(body, "deterministic", False),
        stop_token_ids=_stop_token_ids(body),
        ignore_eos=_bool(body, "ignore_eos", False),
        logprobs=logprobs,
    )


def _stream_options(body: Mapping, is_stream: bool) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not is_stream:
        raise _bad("stream_options", "is only allowed when stream is true")
    if not isinstance(options, Mapping) or set(options) - {"include_usage"}:
        raise _bad("stream_options", "must be an object with the one field include_usage")
    return _bool(options, "include_usage", False)


def _model(body: Mapping) -> str | None:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad("model", f"must be a string, got {_kind(model)}")
    return model


def _common_no_ops(body: Mapping) -> None:
    _no_op(body, "presence_penalty", lambda v: v == 0)
    _no_op(body, "frequency_penalty", lambda v: v == 0)
    _no_op(body, "logit_bias", lambda v: v == {})
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise _bad("user", f"must be a string, got {_kind(user)}")


_COMMON = frozenset({
    "model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "n", "logprobs", "stream",
    "stream_options", "deterministic", "stop_token_ids", "ignore_eos", "return_token_ids", "user",
    "presence_penalty", "frequency_penalty", "logit_bias",
})
_COMPLETION_FIELDS = _COMMON | {"prompt", "best_of", "echo", "suffix"}
_CHAT_FIELDS = _COMMON | {"messages", "top_logprobs", "max_completion_tokens", "tools", "tool_choice",
                          "response_format", "parallel_tool_calls"}


def _max_tokens(body: Mapping, name: str, default: int | None, limits: Limits) -> int | None:
    return _int(body, name, default, minimum=1, maximum=limits.max_tokens)


def _n(body: Mapping, limits: Limits) -> int:
    return _int(body, "n", 1, minimum=1, maximum=limits.max_n)


# -- /v1/completions -----------------------------------------------------------------------------
def _prompts(value, limits: Limits) -> tuple:
    """A string, an array of token ids, or an array of either (a batch)."""
    if isinstance(value, str):
        prompts = [value]
    elif isinstance(value, list) and value and all(_is_int(t) for t in value):
        prompts = [value]
    elif isinstance(value, list) and value and all(isinstance(p, (str, list)) for p in value):
        prompts = value
    else:
        raise _bad("prompt", "must be a string, an array of token ids, or an array of strings or token-id arrays "
                             f"(non-empty), got {_kind(value)}")
    if len(prompts) > limits.max_prompts:
        raise _bad("prompt", f"at most {limits.max_prompts} prompts per request, got {len(prompts)}")
    for prompt in prompts:
        if isinstance(prompt, list) and not all(_is_int(t) for t in prompt):
            raise _bad("prompt", "token-id arrays must hold integers only")
        if len(prompt) == 0:
            raise _bad("prompt", "must not be empty")
    return tuple(prompts)


def parse_completion(body, limits: Limits) -> GenerationRequest:
    """A ``POST /v1/completions`` body."""
    _check_fields(body, _COMPLETION_FIELDS)
    if "prompt" not in body:
        raise APIError(400, "prompt: this field is required", param="prompt")
    prompts = _prompts(body["prompt"], limits)
    _common_no_ops(body)
    n = _n(body, limits)
    _no_op(body, "best_of", lambda v: v == n)
    _no_op(body, "echo", lambda v: v is False)
    _no_op(body, "suffix", lambda v: v == "")
    logprobs = _int(body, "logprobs", None, minimum=0, maximum=MAX_COMPLETION_LOGPROBS)
    max_tokens = _max_tokens(body, "max_tokens", DEFAULT_COMPLETION_MAX_TOKENS, limits)
    stream = _bool(body, "stream", False)
    return GenerationRequest(
        kind="completion", model=_model(body), prompts=prompts,
        params=_sampling(body, max_tokens=max_tokens, logprobs=logprobs is not None),
        max_tokens=max_tokens, n=n, stop=_stop(body), stream=stream,
        include_usage=_stream_options(body, stream), logprobs=logprobs,
        return_token_ids=_bool(body, "return_token_ids", False),
    )


# -- /v1/chat/completions ------------------------------------------------------------------------
def _message_text(i: int, content) -> str:
    if isinstance(content, str):
        return content
    # the array form: text parts only
    if isinstance(content, list) and all(isinstance(p, Mapping) for p in content):
        texts = []
        for part in content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise _bad("messages", f"message {i}: only text content parts are supported")
            texts.append(part["text"])
        return "".join(texts)
    raise _bad("messages", f"message {i}: content must be a string or an array of text parts")


def _messages(value) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise _bad("messages", f"must be a non-empty array of messages, got {_kind(value)}")
    messages = []
    for i, message in enumerate(value):
        if not isinstance(message, Mapping):
            raise _bad("messages", f"message {i} must be an object, got {_kind(message)}")
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise _bad("messages", f"message {i}: role must be a non-empty string")
        if message.get("content") is None:
            raise _bad("messages", f"message {i}: content is required")
        messages.append({"role": role, "content": _message_text(i, message["content"])})
    return messages


def parse_chat(body, limits: Limits) -> GenerationRequest:
    """A ``POST /v1/chat/completions`` body."""
    _check_fields(body, _CHAT_FIELDS)
    if "messages" not in body:
        raise APIError(400, "messages: this field is required", param="messages")
    messages = _messages(body["messages"])
    _common_no_ops(body)
    for name in ("tools", "tool_choice", "response_format", "parallel_tool_calls"):
        _no_op(body, name, lambda v: False)
    n = _n(body, limits)
    is_logprobs = _bool(body, "logprobs", False)
    top = _int(body, "top_logprobs", None, minimum=0, maximum=MAX_CHAT_TOP_LOGPROBS)
    if top is not None and not is_logprobs:
        raise _bad("top_logprobs", "needs logprobs set to true")
    if "max_tokens" in body and "max_completion_tokens" in body:
        raise _bad("max_completion_tokens", "give max_tokens or max_completion_tokens, not both")
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _max_tokens(body, name, None, limits)
    stream = _bool(body, "stream", False)
    return GenerationRequest(
        kind="chat", model=_model(body), prompts=(messages,),
        params=_sampling(body, max_tokens=max_tokens, logprobs=is_logprobs),
        max_tokens=max_tokens, n=n, stop=_stop(body), stream=stream,
        include_usage=_stream_options(body, stream), logprobs=(top or 0) if is_logprobs else None,
        return_token_ids=_bool(body, "return_token_ids", False),
    )
