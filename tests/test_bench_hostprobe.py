"""``llm42.bench.hostprobe``: the host-speed figures every benchmark JSON records beside its device (round 39)."""

from __future__ import annotations

import math
import types
from pathlib import Path

import pytest
import torch

from llm42.bench import hostprobe
from llm42.bench.script import run_meta


def test_host_probe_reports_each_workload_per_operation():
    probe = hostprobe.host_probe(repeats=1)
    assert set(probe) == {"python_us", "numpy_us", "torch_us"}
    assert all(math.isfinite(v) and v > 0 for v in probe.values()), probe
    # a per-operation figure, not a round's: no workload's operation takes anywhere near a millisecond
    assert all(v < 1000 for v in probe.values()), probe


def test_timed_us_is_the_median_round_per_operation(monkeypatch):
    """With a fake clock whose rounds of 4 operations take 9, 1 and 2 s, the figure is the median round's (2 s) per
    operation in microseconds; the mean (4 s), the first round (9 s) or the fastest (1 s) would give another."""
    ticks = iter([0.0, 9.0, 10.0, 11.0, 11.0, 13.0])
    monkeypatch.setattr(hostprobe.time, "perf_counter", lambda: next(ticks))
    calls = []
    assert hostprobe._timed_us(calls.append, 4, 3) == pytest.approx(2.0 / 4 * 1e6)
    assert calls == [4, 4, 4]  # each round runs the workload once, n operations


@pytest.mark.parametrize("repeats", [0, -1, True, 1.5, "3"])
def test_host_probe_rejects_a_bad_repeats(repeats):
    with pytest.raises(ValueError, match="repeats"):
        hostprobe.host_probe(repeats=repeats)


def test_benchmark_meta_records_the_host_probe():
    meta = run_meta(types.SimpleNamespace(budget_s=1.0), torch.device("cpu"), Path(__file__).resolve().parents[1])
    assert set(meta["host_probe"]) == {"python_us", "numpy_us", "torch_us"}
    assert meta["device"]["type"] == "cpu"
