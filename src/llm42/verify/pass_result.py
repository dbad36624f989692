"""PassResult: a launched canonical pass's tokens and log-probs, read once the pass has finished (a CUDA event,
a CPU worker's future, or a sliced pass's last slice)."""

from __future__ import annotations

import concurrent.futures
import time
from concurrent.futures import Future

import numpy as np
import torch


class PassResult:
    """Tokens and log-probs of one launched pass, readable once its event has completed.

    ``top`` (device tensors, ids [R, K] and log-probs [R, K]) when the pass computed top-N alternatives.
    ``slices``: a sliced pass's later slices (``canonical_pass._SlicedRun``: ``advance(result)`` launches the
    next, the last one calls ``fill``), launched one per ``advance`` or all by ``wait``; the result is not
    ready before the last one has run.
    """

    def __init__(self, tokens: torch.Tensor | None, logprobs: torch.Tensor | None, event: torch.cuda.Event | None,
                 top: tuple[torch.Tensor, torch.Tensor] | None = None, *, future: Future | None = None,
                 wanted: list[int] | None = None, num_rows: int | None = None, slices=None):
        self._slices = slices
        self._tokens = tokens
        self._logprobs = logprobs
        self._event = event
        self._top = top
        self._future = future  # a CPU pass on the worker thread: (tokens, log-probs, top) once done
        # a wide pass computed results for the pass rows ``wanted`` only (in that order): results are
        # handed out per pass row all the same, 0 / nan / {} at the rows nobody asked for
        self._wanted = wanted
        self.num_rows = num_rows  # the rows the pass computed (its bucket)

    def _per_row(self, values: list, fill) -> list:
        if self._wanted is None:
            return values
        out = [fill] * self.num_rows
        for value, row in zip(values, self._wanted.tolist()):
            out[row] = value
        return out

    def fill(self, tokens: torch.Tensor, logprobs: torch.Tensor, event: torch.cuda.Event | None,
             top: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        """A sliced pass's results, from its last slice (``event``: their copy to the host): no slice is left."""
        self._tokens, self._logprobs, self._event, self._top = tokens, logprobs, event, top
        self._slices = None

    @property
    def has_pending_slices(self) -> bool:
        return self._slices is not None

    def advance(self) -> None:
        """Launch a sliced pass's next slice (the last one with the head, the sampler and the copy-out); nothing
        where none is left."""
        if self._slices is not None:
            self._slices.advance(self)

    def _complete(self) -> None:
        while self._slices is not None:
            self._slices.advance(self)

    def is_ready(self) -> bool:
        if self._slices is not None:
            return False
        if self._future is not None:
            return self._future.done()
        return self._event is None or self._event.query()

    def wait_ready(self, timeout_s: float) -> bool:
        """Block up to ``timeout_s`` seconds for the pass to finish (a sliced pass's slices left all launched now);
        whether it has."""
        self._complete()
        if self._future is not None:
            concurrent.futures.wait([self._future], timeout=timeout_s)
            return self._future.done()
        if self._event is None:
            return True
        deadline = time.perf_counter() + timeout_s
        while not self._event.query():
            if time.perf_counter() >= deadline:
                return False
            time.sleep(50e-6)
        return True

    def _resolve(self) -> None:
        if self._future is None:
            return
        # the worker writes the pass's K/V until it is done: an interrupt (^C) here must not let the caller
        # go on (abort, free blocks) while it does, so wait it out and raise the interrupt afterwards
        interrupted = None
        while True:
            try:
                concurrent.futures.wait([self._future])
                break
            except BaseException as exc:  # noqa: BLE001 - re-raised below, once the worker is done
                interrupted = exc
        future, self._future = self._future, None
        if interrupted is not None:
            raise interrupted
        self._tokens, self._logprobs, self._top = future.result()  # re-raises what the pass raised

    def _scattered(self, values: torch.Tensor, fill) -> list:
        """``values`` (one per result row) per pass row, ``fill`` at the rows nobody asked for."""
        if self._wanted is None:
            return values.tolist()
        out = np.full(self.num_rows, fill, dtype=values.numpy().dtype)
        out[self._wanted] = values.numpy()[: self._wanted.size]
        return out.tolist()

    def wait(self) -> tuple[list[int], list[float]]:
        self._complete()
        self._resolve()
        if self._event is not None:
            self._event.synchronize()
        return self._scattered(self._tokens, 0), self._scattered(self._logprobs, float("nan"))

    def top_logprobs(self) -> list[dict[int, float]] | None:
        """Per row, its most likely tokens (id -> log-prob, most likely first, probability-0 entries left out)."""
        self._complete()
        self._resolve()
        if self._top is None:
            return None
        return self._per_row(top_dicts(*self._top), {})


def top_dicts(ids: torch.Tensor, logprobs: torch.Tensor) -> list[dict[int, float]]:
    """ids, logprobs: [N, K] -> per row {id: log-prob} in rank order, without -inf entries."""
    return [{i: lp for i, lp in zip(row_ids, row_lps) if lp != float("-inf")}
            for row_ids, row_lps in zip(ids.tolist(), logprobs.tolist())]
