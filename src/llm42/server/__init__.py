"""``llm42 serve``: an OpenAI-compatible HTTP API on one ``AsyncEngine`` (needs the ``serve`` extra).

    from llm42 import AsyncEngine, DVRGenerator
    from llm42.server import build_app, serve
    serve(DVRGenerator.from_pretrained(), host="127.0.0.1", port=8000)

See docs/serving.md for the endpoints, the request fields and what ``deterministic``
guarantees over HTTP.
"""

from __future__ import annotations

from llm42.gc_freeze import frozen_gc
from llm42.server.app import build_app
from llm42.server.protocol import APIError, Limits

__all__ = ["build_app", "serve", "APIError", "Limits"]


def serve(generator, *, host: str = "127.0.0.1", port: int = 8000, model_name: str = "llm42",
          api_key: str | None = None, limits: Limits | None = None, max_pending: int = 1024,
          shutdown_timeout: float = 30.0, log_level: str = "info", gc_freeze: bool = True,
          capture_graphs: bool = True) -> None:
    """Serve ``generator`` until SIGINT/SIGTERM, then shut down gracefully: stop accepting, let in-flight
    requests finish for up to ``shutdown_timeout`` seconds, abort the rest and free everything.

    ``gc_freeze``: while serving, the objects that exist once the app is built (torch, the model, the engine) are
    kept out of the cyclic collector's full passes (``llm42.gc_freeze.frozen_gc``), so its pauses in engine steps
    scan what serving allocates only.

    ``capture_graphs``: before taking requests, every CUDA graph the engine replays is captured
    (``DVRGenerator.capture_graphs``; a generator without that method, or off CUDA, captures nothing), so no request
    waits for a capture mid-serving; the counts and seconds go to stderr."""
    import asyncio
    import sys
    import time

    import uvicorn

    from llm42.async_engine import AsyncEngine

    class _Server(uvicorn.Server):
        async def shutdown(self, sockets=None) -> None:
            # drain before uvicorn closes connections: new requests get 503, in-flight ones run for up to
            # shutdown_timeout seconds and are then aborted, so every open stream still ends properly
            await asyncio.to_thread(engine.close, drain_timeout=shutdown_timeout)
            await super().shutdown(sockets)

    capture = getattr(generator, "capture_graphs", None) if capture_graphs else None
    if callable(capture):
        start = time.perf_counter()
        counts = capture()
        if any(counts.values()):
            print(f"llm42 serve: captured {sum(counts.values())} CUDA graphs in {time.perf_counter() - start:.1f} s "
                  f"({', '.join(f'{kind} {n}' for kind, n in counts.items())})", file=sys.stderr)
    engine = AsyncEngine(generator, max_pending=max_pending)
    app = build_app(engine, model_name=model_name, api_key=api_key, limits=limits)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=10)
    try:
        with frozen_gc(gc_freeze):
            _Server(config).run()
    finally:
        engine.close()
