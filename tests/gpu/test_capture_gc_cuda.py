"""A garbage collection inside a CUDA graph capture, and why ``capture_graph`` keeps the collector off.

Cyclic garbage that holds captured graphs (an earlier generator a caller's wrapper kept in a cycle, as
tests/gpu/test_pass_order_cuda.py does) is freed by whichever collection trips first; one that trips inside a
capture destroys those graphs there, a call a capture forbids, and the capture fails (round 40 on an H100:
``CUBLAS_STATUS_EXECUTION_FAILED`` in a canonical pass's capture). Negative control: a collection inside a plain
``torch.cuda.graph`` capture, with such garbage, fails it; ``capture_graph`` keeps the collector off while it
captures, and its graph replays right.
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


def test_a_collection_inside_a_capture_breaks_it():
    """The negative control: graphs in cyclic garbage collected inside a capture (the collection a tripped
    threshold would run, run here explicitly) invalidate it."""
    x = torch.ones(256, device="cuda")
    held = _cycles_holding_graphs()

    def fn():
        held.clear()  # their cycles become garbage inside the capture
        gc.collect()
        return x * 3

    broken = torch.cuda.CUDAGraph()
    with pytest.raises(Exception):  # noqa: B017 - torch raises RuntimeError or AcceleratorError by version
        with torch.cuda.graph(broken):
            fn()
    assert not held
    del broken
    torch.cuda.synchronize()


def test_capture_graph_keeps_the_collector_off_while_it_captures():
    x = torch.ones(256, device="cuda")
    seen = []

    def fn():
        if torch.cuda.is_current_stream_capturing():
            seen.append(gc.isenabled())
        return x * 3

    assert gc.isenabled()
    graph, out = capture_graph(fn, torch.cuda.graph_pool_handle())
    assert seen == [False]  # not vacuous: the capture ran fn once
    assert gc.isenabled()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, x * 3)
