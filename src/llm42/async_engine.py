"""AsyncEngine: one engine-loop thread owns a DVRGenerator; any thread submits, streams and aborts.

The threading model: a ``DVRGenerator`` is not shared. Its engine loop (one daemon
thread) is the only code that calls it; it steps the generator while there is work
and sleeps on its command queue while there is none. Other threads talk to it
through thread-safe calls that only enqueue commands (``submit``, ``abort``,
``close``), and receive each request's committed tokens on an asyncio stream
(``RequestStream``) bound to the event loop of the caller. So concurrent clients
are safe by construction, and every stream receives all of its request's tokens.

    engine = AsyncEngine(DVRGenerator.from_pretrained())
    stream = engine.submit("Once upon a time", SamplingParams(max_new_tokens=16, deterministic=True))
    async for chunk in stream:          # Output: newly committed token ids (and log-probs)
        ...
    stream.completion                   # the Completion, once the stream has ended
    engine.close()

A request is accepted or refused at once: ``EngineFullError`` when ``max_pending``
requests are already in the engine, ``EngineClosedError`` once ``close`` began.
Bad input (the generator's ``ValueError``/``TypeError``, naming the field) is
raised by ``await stream.accepted()`` and by the first ``__anext__``.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

from llm42.generator import takes_deliver
from llm42.params import Completion, SamplingParams

__all__ = ["AsyncEngine", "RequestStream", "Output", "EngineSnapshot", "EngineFullError", "EngineClosedError",
           "EngineStepError"]

_log = logging.getLogger("llm42.engine")


class EngineFullError(RuntimeError):
    """The engine holds ``max_pending`` requests already (HTTP 429)."""


class EngineClosedError(RuntimeError):
    """The engine is shutting down or has shut down (HTTP 503)."""


class EngineStepError(RuntimeError):
    """The engine loop failed to step ``max_step_failures`` times in a row; in-flight requests were aborted."""


@dataclass(frozen=True)
class Output:
    """Tokens one request committed in one engine step (committed tokens only)."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...] | None  # when the request asked for logprobs
    top_logprobs: tuple[dict[int, float], ...] | None = None  # with logprobs=N: N alternatives per token


@dataclass(frozen=True)
class EngineSnapshot:
    """The engine's state after its latest iteration (published by the loop; safe to read from any thread)."""

    stats: dict[str, int] = field(default_factory=dict)
    num_pending: int = 0  # requests in the engine (waiting, running, or not yet taken by the loop)
    num_running: int = 0
    num_waiting: int = 0
    num_kv_blocks: int | None = None
    num_kv_used_blocks: int | None = None
    num_kv_cached_blocks: int | None = None
    num_step_failures: int = 0
    is_running: bool = False


_END = object()  # queued after the last Output of a stream


class RequestStream:
    """The committed tokens of one request, as an async iterator of ``Output``.

    Iteration ends when the request finishes (``completion`` is then set, its
    ``finish_reason`` "stop", "length" or "abort"); it raises the validation error
    of a refused request, or ``EngineStepError``. ``abort()`` is thread-safe.
    """

    def __init__(self, engine: "AsyncEngine", params: SamplingParams, sample: int, loop: asyncio.AbstractEventLoop):
        self._engine = engine
        self.params = params
        self.sample = sample  # which of the prompt's ``params.n`` samples
        self.loop = loop
        self.completion: Completion | None = None
        self._queue: asyncio.Queue = asyncio.Queue()
        self._accepted: Future = Future()  # resolved by the engine loop: the request id, or the error
        self._error: BaseException | None = None
        self._is_aborted = False
        self._is_done = False

    @property
    def rid(self) -> int | None:
        """The generator's request id once the engine loop has taken the request."""
        if self._accepted.done() and self._accepted.exception() is None:
            return self._accepted.result()
        return None

    async def accepted(self) -> int:
        """Wait until the engine loop took the request; its id, or the validation error it raised."""
        return await asyncio.wrap_future(self._accepted)

    def abort(self) -> None:
        """Stop the request now (thread-safe, idempotent); the stream ends with finish_reason "abort"."""
        if not self._is_aborted:
            self._is_aborted = True
            self._engine._post(("abort", self))

    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> Output:
        if self._is_done:
            raise StopAsyncIteration
        item = await self._queue.get()
        if item is _END:
            self._is_done = True
            if self._error is not None:
                raise self._error
            raise StopAsyncIteration
        return item

    async def result(self) -> Completion:
        """Drain the stream; the Completion."""
        async for _ in self:
            pass
        return self.completion

    # called on the stream's event loop (the engine loop schedules these)
    def _deliver(self, item) -> None:
        self._queue.put_nowait(item)

    def _end(self, completion: Completion | None, error: BaseException | None) -> None:
        self.completion, self._error = completion, error
        self._queue.put_nowait(_END)


class AsyncEngine:
    """Owns a ``DVRGenerator`` on one engine-loop thread; thread-safe ``submit``/``abort``, asyncio streams.

    ``max_pending`` bounds the requests in the engine (queued and running): a
    ``submit`` beyond it raises ``EngineFullError`` instead of queueing without
    bound. A step that raises is logged and retried (a failed step leaves the
    committed state intact); after ``max_step_failures`` failures in a row every
    in-flight request is aborted and its stream raises ``EngineStepError``.
    """

    def __init__(self, generator, *, max_pending: int = 1024, max_step_failures: int = 3, start: bool = True):
        for name, value in (("max_pending", max_pending), ("max_step_failures", max_step_failures)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        self.generator = generator
        self._step_fn: tuple[object, bool] | None = None  # (the generator's step function, whether it takes deliver)
        self.max_pending = max_pending
        self.max_step_failures = max_step_failures
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()  # guards _num_pending and _is_closing
        self._num_pending = 0
        self._is_closing = False
        self._streams: dict[int, RequestStream] = {}  # engine-loop thread only
        self._num_step_failures = 0
        self._snapshot = EngineSnapshot()
        self._thread = threading.Thread(target=self._run, name="llm42-engine", daemon=True)
        self._stopped = threading.Event()
        if start:
            self.start()

    # -- any thread --------------------------------------------------------------------------
    def start(self) -> None:
        """Start the engine loop (the constructor does, unless ``start=False``)."""
        self._thread.start()

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive() and not self._is_closing

    @property
    def num_pending(self) -> int:
        """Requests in the engine now (the snapshot's count lags by up to one iteration)."""
        with self._lock:
            return self._num_pending

    @property
    def snapshot(self) -> EngineSnapshot:
        return self._snapshot

    def submit(self, prompt, params: SamplingParams | None = None, *,
               loop: asyncio.AbstractEventLoop | None = None) -> RequestStream:
        """Queue one request (``params.n`` must be 1: see ``submit_all``); its ``RequestStream`` delivers
        on ``loop`` (default: the running loop)."""
        params = SamplingParams() if params is None else params
        if params.n != 1:
            raise ValueError(f"SamplingParams.n is {params.n}: submit() queues one request; use submit_all()")
        return self.submit_all([prompt], [params], loop=loop)[0]

    def submit_all(self, prompts: Sequence, params: Sequence[SamplingParams | None], *,
                   loop: asyncio.AbstractEventLoop | None = None) -> list[RequestStream]:
        """Queue requests that stand or fall together: if one is refused, none runs (all streams raise).

        A prompt whose params have ``n > 1`` gets n streams, one per sample (seeded as
        ``DVRGenerator.submit_samples`` seeds them), one after another in the result.
        """
        if len(prompts) != len(params):
            raise ValueError(f"params has {len(params)} entries for {len(prompts)} prompts")
        loop = asyncio.get_running_loop() if loop is None else loop
        params = [SamplingParams() if p is None else p for p in params]
        for p in params:
            if not isinstance(p, SamplingParams):
                raise TypeError(f"params must be SamplingParams, got {type(p).__name__}")
        num_requests = sum(p.n for p in params)
        with self._lock:
            if self._is_closing or not self._thread.is_alive():
                raise EngineClosedError("the engine is shutting down")
            if self._num_pending + num_requests > self.max_pending:
                raise EngineFullError(f"the engine already holds {self._num_pending} requests "
                                      f"(max_pending={self.max_pending})")
            self._num_pending += num_requests
        groups = [(prompt, p, [RequestStream(self, p, i, loop) for i in range(p.n)])
                  for prompt, p in zip(prompts, params)]
        self._post(("submit", groups))
        return [stream for _, _, streams in groups for stream in streams]

    def abort(self, stream: RequestStream) -> None:
        """Abort a request (thread-safe): ``stream.abort()``."""
        stream.abort()

    def close(self, *, drain_timeout: float = 0.0, join_timeout: float | None = 60.0) -> None:
        """Stop accepting requests; let in-flight ones run up to ``drain_timeout`` seconds, abort the rest,
        release the generator (``close()`` where it has one) and stop the loop. Idempotent."""
        with self._lock:
            was_closing, self._is_closing = self._is_closing, True
        if not was_closing and self._thread.is_alive():
            self._post(("close", drain_timeout))
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(join_timeout)

    def __enter__(self) -> "AsyncEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _post(self, command) -> None:
        self._commands.put(command)

    # -- the engine-loop thread ----------------------------------------------------------------
    def _run(self) -> None:
        gen = self.generator
        drain_deadline: float | None = None
        try:
            self._publish()  # the snapshot is whole before the first request (/metrics reads it)
            while True:
                # a stream may still be open with nothing unfinished: an abort or a score() applied a
                # canonical pass whose commits (and finishes) are only reported by the next step
                is_busy = gen.has_unfinished() or bool(self._streams)
                try:
                    # block only when there is nothing to step
                    command = self._commands.get(block=not is_busy and drain_deadline is None, timeout=None)
                except queue.Empty:
                    command = None
                while command is not None:
                    try:
                        drain_deadline = self._apply(command, drain_deadline)
                    except Exception:  # noqa: BLE001 - one bad command must not stop the loop
                        _log.exception("engine command %r failed", command[0])
                    try:
                        command = self._commands.get_nowait()
                    except queue.Empty:
                        command = None
                if drain_deadline is not None:
                    if time.monotonic() >= drain_deadline or not gen.has_unfinished():
                        break
                if gen.has_unfinished() or self._streams:
                    self._step()
                self._publish()
        finally:
            self._shut_down()

    def _apply(self, command, drain_deadline: float | None) -> float | None:
        kind, arg = command
        if kind == "submit":
            self._accept(arg)
        elif kind == "abort":
            self._abort(arg)
        elif kind == "close" and drain_deadline is None:
            drain_deadline = time.monotonic() + max(0.0, arg)
        return drain_deadline

    def _accept(self, groups: list) -> None:
        gen, taken = self.generator, []
        try:
            for prompt, params, _ in groups:
                taken.append(gen.submit_samples(prompt, params))
        except Exception as exc:  # noqa: BLE001 - handed to the caller, who asked for these requests
            for rid in (rid for rids in taken for rid in rids):  # all or nothing: none has been stepped yet
                gen.abort(rid)
            for _, _, streams in groups:
                for stream in streams:
                    stream._accepted.set_exception(exc)
                    self._end(stream, None, exc)
            return
        for (_, _, streams), rids in zip(groups, taken):
            for stream, rid in zip(streams, rids):
                self._streams[rid] = stream
                stream._accepted.set_result(rid)

    def _abort(self, stream: RequestStream) -> None:
        rid = stream.rid
        if rid is None or rid not in self._streams:
            return  # not taken yet (handled by _accept) or already finished
        completion = self.generator.abort(rid)
        self._take(rid, completion)

    def _step(self) -> None:
        gen = self.generator
        try:
            # a DVRGenerator hands over the tokens read back before its canonical phase (step's ``deliver``):
            # they reach their streams before the step applies and launches passes
            step = gen.step
            events = step(deliver=self._publish_tokens) if self._takes_deliver(step) else step()
        except Exception as exc:  # noqa: BLE001 - the loop must survive a failed step
            self._num_step_failures += 1
            _log.exception("engine step failed (%d in a row)", self._num_step_failures)
            if self._num_step_failures >= self.max_step_failures:
                self._fail_all(EngineStepError(f"the engine step failed {self._num_step_failures} times in a row: "
                                               f"{type(exc).__name__}: {exc}"))
                self._num_step_failures = 0
            return
        self._num_step_failures = 0
        self._publish_tokens(events)
        for rid in [rid for rid in self._streams if gen.is_finished(rid)]:
            self._take(rid, gen.result(rid))

    def _takes_deliver(self, step) -> bool:
        """Whether ``step`` (the generator's, read each time: a test may swap it) takes ``deliver``."""
        fn = getattr(step, "__func__", step)
        if self._step_fn is None or self._step_fn[0] is not fn:
            self._step_fn = (fn, takes_deliver(step))
        return self._step_fn[1]

    def _publish_tokens(self, events: dict[int, list[int]]) -> None:
        """Hand newly committed tokens (and their log-probs where asked) to their streams' event loops."""
        gen = self.generator
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for rid, tokens in events.items():
            stream = self._streams.get(rid)
            if stream is None or not tokens:
                continue
            logprobs = top = None
            if stream.params.wants_logprobs:
                logprobs = tuple(gen.committed_logprobs(rid)[-len(tokens):])
                if stream.params.num_top_logprobs:
                    top = tuple(gen.committed_top_logprobs(rid)[-len(tokens):])
            by_loop.setdefault(stream.loop, []).append((stream, Output(tuple(tokens), logprobs, top)))
        for loop, items in by_loop.items():
            self._call(loop, _deliver_all, items)

    def _take(self, rid: int, completion: Completion) -> None:
        stream = self._streams.pop(rid)
        self._end(stream, completion, None)

    def _end(self, stream: RequestStream, completion: Completion | None, error: BaseException | None) -> None:
        with self._lock:
            self._num_pending -= 1
        self._call(stream.loop, stream._end, completion, error)

    def _call(self, loop: asyncio.AbstractEventLoop, fn, *args) -> None:
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the consumer's event loop is closed: nobody reads these requests any more
            for stream, _ in (args[0] if fn is _deliver_all else ()):
                if stream.rid in self._streams:
                    stream._is_aborted = True
                    self._post(("abort", stream))

    def _fail_all(self, error: BaseException) -> None:
        gen = self.generator
        for rid in list(self._streams):
            stream = self._streams.pop(rid)
            try:
                gen.abort(rid)
            except Exception:  # noqa: BLE001 - the stream still ends, with the step's error
                _log.exception("aborting request %d after failed steps raised", rid)
            self._end(stream, None, error)

    def _publish(self) -> None:
        gen, kv = self.generator, self.generator.kv
        self._snapshot = EngineSnapshot(
            stats=dict(gen.stats), num_pending=self._num_pending, num_running=gen.num_running,
            num_waiting=gen.num_waiting, num_kv_blocks=getattr(kv, "num_blocks", None),
            num_kv_used_blocks=getattr(kv, "num_used_blocks", None),
            num_kv_cached_blocks=getattr(kv, "num_cached_blocks", None),
            num_step_failures=self._num_step_failures, is_running=not self._is_closing,
        )

    def _shut_down(self) -> None:
        gen = self.generator
        for rid in list(self._streams):
            try:
                self._take(rid, gen.abort(rid))
            except Exception as exc:  # noqa: BLE001 - every stream must end
                _log.exception("aborting request %d at shutdown raised", rid)
                self._end(self._streams.pop(rid), None, exc)
        while True:  # submissions that raced with close: refused
            try:
                kind, arg = self._commands.get_nowait()
            except queue.Empty:
                break
            if kind == "submit":
                error = EngineClosedError("the engine shut down")
                for _, _, streams in arg:
                    for stream in streams:
                        stream._accepted.set_exception(error)
                        self._end(stream, None, error)
        self._publish()
        close = getattr(gen, "close", None)
        if callable(close):
            close()
        self._snapshot = EngineSnapshot(**{**self._snapshot.__dict__, "is_running": False})
        self._stopped.set()


def _deliver_all(items: list) -> None:
    for stream, output in items:
        stream._deliver(output)
