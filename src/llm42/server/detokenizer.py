"""Committed tokens -> text deltas, with OpenAI stop sequences.

Streaming and non-streaming answers are built by the same ``TextStream``, so the
concatenated deltas of a stream are exactly the text of the same request answered
at once. Each delta is decoded over a short window of tokens (the previous delta's
tokens plus the new ones, as text-generation-inference does), so sentencepiece's
leading spaces come out right and the cost per token stays constant; text that
ends in an incomplete UTF-8 sequence, or that could be the start of a stop
sequence, is held back until the next tokens decide it.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["TextStream"]

_INCOMPLETE = "\ufffd"


class TextStream:
    """Feed committed token ids with ``add``; it returns the text that is final so far.

    With ``stop`` sequences, the text ends before the first one that appears
    (``is_stopped`` then turns True and later tokens are ignored); ``num_tokens`` counts
    the tokens that produced the returned text. ``finish()`` returns the held-back rest.
    Without a tokenizer every delta is "".
    """

    def __init__(self, tokenizer, stop: Sequence[str] = ()):
        self._tokenizer = tokenizer
        self._stop = tuple(stop)
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self._pending = ""  # decoded but not yet returned (a possible stop prefix)
        self.text = ""  # everything returned so far
        self.num_tokens = 0
        self.is_stopped = False

    def add(self, token_ids: Sequence[int]) -> str:
        if self.is_stopped or self._tokenizer is None:
            self.num_tokens += 0 if self.is_stopped else len(token_ids)
            return ""
        delta = ""
        for token in token_ids:  # one at a time, so a stop is found at the token that completes it
            self._ids.append(token)
            self.num_tokens += 1
            delta += self._release(self._decode_new(is_final=False), is_final=False)
            if self.is_stopped:
                break
        return delta

    def finish(self) -> str:
        """The rest: text held back for an incomplete character or a possible stop sequence."""
        if self.is_stopped or self._tokenizer is None:
            return ""
        return self._release(self._decode_new(is_final=True), is_final=True)

    def _decode_new(self, *, is_final: bool) -> str:
        decode = self._tokenizer.decode
        prefix = decode(self._ids[self._prefix_offset:self._read_offset], skip_special_tokens=True)
        full = decode(self._ids[self._prefix_offset:], skip_special_tokens=True)
        if len(full) > len(prefix) and (is_final or not full.endswith(_INCOMPLETE)):
            self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
            return full[len(prefix):]
        return ""

    def _release(self, new_text: str, *, is_final: bool) -> str:
        text = self._pending + new_text
        if self._stop:
            # the earliest stop sequence in the text not yet returned
            hits = [i for i in (text.find(s) for s in self._stop) if i >= 0]
            if hits:
                self.is_stopped = True
                text, self._pending = text[:min(hits)], ""
            elif not is_final:
                keep = _stop_prefix_length(text, self._stop)
                text, self._pending = text[:len(text) - keep], text[len(text) - keep:]
        self.text += text
        return text


def _stop_prefix_length(text: str, stops: Sequence[str]) -> int:
    """Length of the longest end of ``text`` that begins some stop sequence."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest
