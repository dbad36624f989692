"""Prompts as token ids: from token ids, a string, or a list of chat messages.

A chat prompt is a list of ``{"role": ..., "content": ...}`` messages, rendered
with the tokenizer's chat template followed by the assistant's turn
(``add_generation_prompt=True``), then tokenized without adding special tokens
again, as transformers' ``apply_chat_template(..., tokenize=True)`` does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class Tokenizer(Protocol):
    """What llm42 asks of a tokenizer (a transformers tokenizer is one).

    ``tokenizer(text)["input_ids"]`` encodes a string prompt, ``decode(ids,
    skip_special_tokens=True)`` gives ``Completion.text``; chat prompts also need
    ``apply_chat_template`` and a ``chat_template``.
    """

    def __call__(self, text: str, **kwargs) -> Mapping: ...

    def decode(self, token_ids: Sequence[int], **kwargs) -> str: ...


def is_chat(prompt) -> bool:
    """Whether ``prompt`` is a list of chat messages (its first element is a mapping)."""
    return isinstance(prompt, (list, tuple)) and len(prompt) > 0 and isinstance(prompt[0], Mapping)


def has_chat_template(tokenizer) -> bool:
    return tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))


def check_messages(messages: Sequence) -> list[dict]:
    """Validate chat messages; TypeError / ValueError name the message and the field."""
    checked = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise TypeError(
                f"prompt message {i} must be a dict with 'role' and 'content', got {type(message).__name__}"
            )
        for key in ("role", "content"):
            if key not in message:
                raise ValueError(f"prompt message {i} has no {key!r}")
            if not isinstance(message[key], str):
                raise TypeError(f"prompt message {i}: {key!r} must be a str, got {type(message[key]).__name__}")
        if not message["role"]:
            raise ValueError(f"prompt message {i}: 'role' is empty")
        checked.append(dict(message))
    return checked


def render_chat(tokenizer, messages: Sequence) -> list[int]:
    """Token ids of ``messages`` through the tokenizer's chat template, ending with the assistant's turn."""
    messages = check_messages(messages)
    if tokenizer is None:
        raise ValueError("prompt is a list of chat messages but this model has no tokenizer; pass token ids")
    if not has_chat_template(tokenizer):
        raise ValueError(
            "prompt is a list of chat messages but this model's tokenizer has no chat template; "
            "pass a string or token ids"
        )
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    # the template writes the special tokens (BOS, turn markers) itself
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_prompt(tokenizer, prompt, vocab_size: int) -> list[int]:
    """Token ids of one prompt: token ids (a list, tuple or tensor), a string, or chat messages.

    Raises TypeError / ValueError naming the problem: an empty prompt, a token id
    that is not an int or lies outside ``[0, vocab_size)``, a string or messages
    without a tokenizer (or chat template), a malformed message.
    """
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError("prompt is empty")  # like [], whatever special tokens the tokenizer would add
        if tokenizer is None:
            raise ValueError("prompt is a string but this model has no tokenizer; pass token ids")
        prompt = tokenizer(prompt)["input_ids"]
    elif is_chat(prompt):
        prompt = render_chat(tokenizer, prompt)
    if isinstance(prompt, torch.Tensor):
        prompt = prompt.tolist()
    if not isinstance(prompt, (list, tuple)):
        hint = " (a chat conversation is one prompt: pass [messages])" if isinstance(prompt, Mapping) else ""
        raise TypeError(
            f"prompt must be a list of token ids, a string or a list of chat messages, "
            f"got {type(prompt).__name__}{hint}"
        )
    if len(prompt) == 0:
        raise ValueError("prompt is empty")
    # the common case in C loops (a 15,000-token prompt took ~4 ms in the Python loop below, on the way to
    # its first token); any doubt goes through the loop, which names the offending token
    if set(map(type, prompt)) == {int} and 0 <= min(prompt) and max(prompt) < vocab_size:
        return list(prompt)
    for token in prompt:
        if not isinstance(token, int) or isinstance(token, bool):
            raise TypeError(f"prompt token ids must be ints, got {type(token).__name__} {token!r}")
        if not 0 <= token < vocab_size:
            raise ValueError(f"prompt token id {token} is outside [0, {vocab_size})")
    return list(prompt)
