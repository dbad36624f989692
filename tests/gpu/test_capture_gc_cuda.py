"""A garbage collection inside a CUDA graph capture, and why ``capture_graph`` keeps the collector off.

Cyclic garbage that holds captured graphs (an earlier generator a caller's wrapper kept in a cycle, as
tests/gpu/test_pass_order_cuda.py does) is freed by whichever collection trips first; one that trips inside a
capture destroys those graphs there, a call a capture forbids, and the capture fails (round 40 on an H100:
``CUBLAS_STATUS_EXECUTION_FAILED`` in a canonical pass's capture). Negative control: ``torch.cuda.graph`` with the
collector on, the same garbage and thresholds, fails; ``capture_graph`` captures, and its graph replays right.
"""

from __future__ import annotations

import gc

import pytest
import torch

from llm42.cuda_graphs import capture_graph, collector_off

pytestmark = pytest.mark.gpu


class _Cycle:
    pass


def _cycles_holding_graphs(count: int = 4) -> list[_Cycle]:
    """``count`` captured graphs, each in a reference cycle; the returned list is the only other reference."""
    cycles = []
    with collector_off():
        for _ in range(count):
            x = torch.zeros(256, device="cuda")
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                y = x * 2
            cycle = _Cycle()
            cycle.me, cycle.graph, cycle.y = cycle, graph, y
            cycles.append(cycle)
    return cycles


def _dropping_then_allocating(x: torch.Tensor, held: list):
    """A function to capture: inside the capture it lets go of ``held`` (its cycles become garbage there), then
    allocates tracked objects (with thresholds of 1, a collection at each, where the collector is on)."""
    def fn():
        if torch.cuda.is_current_stream_capturing():
            held.clear()
        junk = [[i] for i in range(2000)]
        return x * 3 + len(junk)
    return fn


def test_a_collection_inside_a_capture_breaks_it_and_capture_graph_keeps_it_out():
    x = torch.ones(256, device="cuda")
    thresholds = gc.get_threshold()
    gc.collect()
    gc.set_threshold(1, 1, 1)
    try:
        held = _cycles_holding_graphs()
        broken = torch.cuda.CUDAGraph()
        with pytest.raises(Exception):  # noqa: B017 - torch raises RuntimeError or AcceleratorError by version
            with torch.cuda.graph(broken):
                _dropping_then_allocating(x, held)()
        assert not held  # not vacuous: the cycles were let go inside the capture
        del broken
        torch.cuda.synchronize()
        held = _cycles_holding_graphs()
        graph, out = capture_graph(_dropping_then_allocating(x, held), torch.cuda.graph_pool_handle())
        assert not held
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, x * 3 + 2000)
    finally:
        gc.set_threshold(*thresholds)
        gc.collect()
