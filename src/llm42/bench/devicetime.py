"""Timing on the device, the two ceilings (copy bandwidth, GEMM rate), time budgets, partial results.

- ``median_ms(fn)``: the median time of ``fn`` — CUDA events around each call on
  CUDA (so host launch gaps inside ``fn`` count, the host's own time before the
  first launch does not), the host clock elsewhere. ``reset`` runs between calls,
  outside the timed region.
- ``measure_ceilings``: a large device-to-device copy (bytes read + written over
  its time) and a large matrix product on random data (never zeros: they run
  faster), the two rates a roofline uses. On CUDA: 2 GiB and 8192^3 in bf16; on
  the CPU, small sizes so smoke runs stay quick (labelled as such).
- ``Budget``: one wall-clock budget for a whole script, handed out to phases by
  cumulative share (a phase that overruns cannot starve the later ones).
- ``write_json``: atomic (temp file + rename), so a run killed mid-write leaves
  the previous complete file.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(fn: Callable[[], object], device: torch.device, *, warmup: int | None = None, reps: int = 20,
              reset: Callable[[], object] | None = None) -> float:
    """Median milliseconds of one ``fn()`` over ``reps`` calls after ``warmup`` calls (default min(3, reps))."""
    is_cuda = device.type == "cuda"
    warmup = min(3, reps) if warmup is None else warmup
    for _ in range(warmup):
        fn()
        if reset is not None:
            reset()
    synchronize(device)
    times = []
    for _ in range(reps):
        if is_cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        if reset is not None:
            reset()
    synchronize(device)
    return statistics.median(times)


def measure_ceilings(device: torch.device) -> dict:
    """Copy bandwidth (GB/s, read + written) and matrix-product rate (TFLOP/s) measured here and now."""
    is_cuda = device.type == "cuda"
    numel = (1 << 29) if is_cuda else (1 << 22)  # 2 GiB / 16 MiB of float32
    src = torch.randn(numel, device=device)
    dst = torch.empty_like(src)
    copy_ms = median_ms(lambda: dst.copy_(src), device, reps=10 if is_cuda else 5)
    copy_bytes = 2 * numel * src.element_size()
    del src, dst
    n = 8192 if is_cuda else 512
    dtype = torch.bfloat16 if is_cuda else torch.float32
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, generator=generator).to(dtype)
    b = torch.randn(n, n, device=device, generator=generator).to(dtype)
    matmul_ms = median_ms(lambda: a @ b, device, reps=10 if is_cuda else 5)
    del a, b
    if is_cuda:
        torch.cuda.empty_cache()
    return {
        "copy_bytes": copy_bytes,
        "copy_ms": copy_ms,
        "copy_GBps": copy_bytes / copy_ms / 1e6,
        "matmul_size": n,
        "matmul_dtype": str(dtype).removeprefix("torch."),
        "matmul_ms": matmul_ms,
        "matmul_TFLOPs": 2 * n**3 / matmul_ms / 1e9,
        "note": None if is_cuda else "CPU smoke sizes (16 MiB copy, 512^3 fp32): not the machine's ceilings",
    }


@dataclass
class Budget:
    """A wall-clock budget from ``started``; phases get deadlines by cumulative share of it."""

    total_s: float
    started: float = field(default_factory=time.perf_counter)
    _cumulative: float = 0.0

    def __post_init__(self) -> None:
        if not self.total_s > 0:
            raise ValueError(f"budget must be > 0 seconds, got {self.total_s!r}")

    @property
    def end(self) -> float:
        return self.started + self.total_s

    def left_s(self) -> float:
        return max(0.0, self.end - time.perf_counter())

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.started

    def phase(self, share: float) -> float:
        """The deadline of the next phase: it ends when this and every earlier phase's share is spent."""
        self._cumulative = min(1.0, self._cumulative + share)
        return self.started + self._cumulative * self.total_s

    def is_past(self, deadline: float) -> bool:
        return time.perf_counter() > deadline


def write_json(path: Path, data: dict) -> None:
    """Write ``data`` to ``path`` atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)
