"""The cyclic garbage collector kept off a serving process's long-lived objects (``frozen_gc``).

Python's collector runs a full (generation 2) pass over every tracked object from time to time, on whichever thread
allocates when its thresholds trip: in an engine step, a pause for every running request at once. At 1,000 running
requests on this project's CPU machine one such pass over ~181K objects (torch, the model, the engine, the requests)
took 75-79 ms in 200 steps of ~17 ms; with the objects that existed when the engine was built frozen (``gc.freeze``),
the full passes in the same 200 steps took 4.7-6.3 ms (two of them) over ~12K objects
(``benchmarks/cpu_gc_pauses.py``; docs/benchmarks.md, "Round 28"). Serving engines do the same after start-up (vLLM
freezes after its graph capture).

Frozen objects are never examined by the collector: one that becomes cyclic garbage while frozen stays until it is
unfrozen. So a process freezes while one long-lived engine serves (``llm42 serve`` does, unless ``--no-gc-freeze``),
not around short-lived generators, and ``frozen_gc`` unfreezes (and collects) when it ends.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0  # nested frozen_gc blocks: the outermost freezes and unfreezes


@contextmanager
def frozen_gc(enabled: bool = True) -> Iterator[None]:
    """While the block runs, the objects that exist when it starts (after a collection) are frozen (``gc.freeze``);
    at its end they are unfrozen and collected. Nested blocks share the outermost's freeze. ``enabled=False``: a
    no-op (a caller's switch)."""
    global _depth
    if not enabled:
        yield
        return
    with _lock:
        _depth += 1
        if _depth == 1:
            gc.collect()
            gc.freeze()
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                gc.unfreeze()
                gc.collect()
