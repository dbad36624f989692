"""How fast this host runs the kind of work the engine's host side does, for comparing benchmark runs across machines.

Round 39 measured the same engine, the same model and the same card (an H100) on two machines: on one the steps
that apply and launch canonical passes took 1.6-1.9x as long on the host, and free requests' online ITL over nondet
at dvr@50 rose from 1.23x to 1.57x at p50, nondet unchanged (docs/benchmarks.md, "Round 39"). A GPU benchmark's
figures therefore carry the host's speed with them. ``host_probe`` times three small workloads shaped like the
engine's host work, each the median of ``repeats`` rounds, in microseconds per operation:

- ``python_us``: per-request bookkeeping in plain Python (a tuple built, a dict read and written, a list appended to,
  a ``len``), as in building the scheduler's views, reading tokens back and applying commits;
- ``numpy_us``: a small NumPy staging sequence (``fromiter``, ``repeat``, ``cumsum`` on 64 values), as in staging a
  canonical pass's rows;
- ``torch_us``: a small CPU tensor op through the dispatcher (``index_copy_`` of 8 values), the per-call cost under
  every torch call the host makes.

It takes ~50 ms. The figures are comparable between machines only at the same Python, NumPy and torch versions
(the benchmark JSONs record Python's and torch's beside them, ``llm42.bench.suite.device_info``).
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch

_PYTHON_OPS, _NUMPY_OPS, _TORCH_OPS = 2000, 300, 300


def _python_round(n: int) -> None:
    table: dict[int, int] = {}
    out: list[tuple] = []
    for i in range(n):
        entry = (i, i & 7, i + 1, False)
        table[i & 255] = table.get(i & 255, 0) + len(entry)
        out.append(entry)


def _numpy_round(n: int) -> None:
    values = list(range(64))
    for _ in range(n):
        counts = np.fromiter(values, np.int64, 64)
        np.cumsum(np.repeat(counts[:8], 8))


def _torch_round(n: int) -> None:
    dst = torch.zeros(64, dtype=torch.int64)
    index = torch.arange(8)
    src = torch.ones(8, dtype=torch.int64)
    for _ in range(n):
        dst.index_copy_(0, index, src)


def _timed_us(fn, n: int, repeats: int) -> float:
    """The median over ``repeats`` rounds of ``fn(n)``'s time, in microseconds per operation."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(n)
        times.append((time.perf_counter() - start) / n * 1e6)
    return statistics.median(times)


def host_probe(repeats: int = 5) -> dict[str, float]:
    """``{"python_us", "numpy_us", "torch_us"}``: this host's time per operation of each workload (module doc)."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"host_probe: repeats must be a positive int, got {repeats!r}")
    _python_round(100)  # warm the interpreter's caches and the dispatcher once
    _numpy_round(10)
    _torch_round(10)
    return {"python_us": round(_timed_us(_python_round, _PYTHON_OPS, repeats), 4),
            "numpy_us": round(_timed_us(_numpy_round, _NUMPY_OPS, repeats), 4),
            "torch_us": round(_timed_us(_torch_round, _TORCH_OPS, repeats), 4)}


__all__ = ["host_probe"]
