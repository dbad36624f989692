"""``capture_graph`` keeps Python's cyclic garbage collector off while it captures (``cuda_graphs.collector_off``):
a collection inside a capture can destroy an earlier generator's graphs, a call a capture forbids
(tests/gpu/test_capture_gc_cuda.py shows it on the device). Here on the CPU, with torch's graph API faked: the
collector's state inside the capture and after it, also when the captured function raises."""

from __future__ import annotations

import contextlib
import gc

import pytest
import torch

from llm42 import cuda_graphs


class _FakeStream:
    def wait_stream(self, other) -> None:
        pass


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch's graph and stream calls replaced by no-ops; the list records (phase, gc enabled) per fn call."""
    seen: list[tuple[str, bool]] = []
    phase = {"now": "warm-up"}

    @contextlib.contextmanager
    def graph(*args, **kwargs):
        phase["now"] = "capture"
        try:
            yield
        finally:
            phase["now"] = "after"

    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: object())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: _FakeStream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    return seen, phase


@pytest.mark.parametrize("enabled_before", [True, False])
def test_the_collector_is_off_during_the_capture_only(fake_cuda, enabled_before):
    seen, phase = fake_cuda
    (gc.enable if enabled_before else gc.disable)()
    try:
        cuda_graphs.capture_graph(lambda: seen.append((phase["now"], gc.isenabled())), None, stream=_FakeStream())
        assert [p for p, _ in seen] == ["warm-up", "capture"]  # not vacuous: both calls ran
        assert seen[1] == ("capture", False)
        assert seen[0] == ("warm-up", enabled_before)
        assert gc.isenabled() is enabled_before  # as it was
    finally:
        gc.enable()


def test_the_collector_comes_back_when_the_capture_raises(fake_cuda):
    seen, phase = fake_cuda

    def fn():
        seen.append((phase["now"], gc.isenabled()))
        if phase["now"] == "capture":
            raise RuntimeError("capture failed")

    gc.enable()
    with pytest.raises(RuntimeError, match="capture failed"):
        cuda_graphs.capture_graph(fn, None, stream=_FakeStream())
    assert seen == [("warm-up", True), ("capture", False)]
    assert gc.isenabled()


def test_collector_off_stops_automatic_collections():
    """What the block guarantees, shown against the collector's own counters: thresholds of 1 would collect at
    every allocation of a tracked object; inside the block none runs (negative control: outside, they do)."""
    thresholds = gc.get_threshold()
    gc.enable()
    gc.set_threshold(1, 1, 1)
    try:
        with cuda_graphs.collector_off():
            before = sum(s["collections"] for s in gc.get_stats())
            junk = [[i] for i in range(100)]
            inside = sum(s["collections"] for s in gc.get_stats()) - before
        before = sum(s["collections"] for s in gc.get_stats())
        junk = [[i] for i in range(100)]
        outside = sum(s["collections"] for s in gc.get_stats()) - before
    finally:
        gc.set_threshold(*thresholds)
    del junk
    assert inside == 0
    assert outside > 0
