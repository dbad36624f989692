"""``benchmarks/device/beside_kernels.py``'s trace reading and summaries, on synthetic kernels (the script itself
needs CUDA): kernels read from a chrome trace by category, replays split evenly, spans / kernel time / gaps, per
class, and the per-position growth beside a pass. Negative control: replays of unequal length give no growth table
(a kernel matched to another position would compare two different kernels)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "device"))
beside_kernels = pytest.importorskip("beside_kernels")


def _replay(t0: float, durations: list[tuple[str, float]], gap: float = 1.0) -> list[dict]:
    out, t = [], t0
    for name, dur in durations:
        out.append({"name": name, "ts": t, "dur": dur, "stream": 7})
        t += dur + gap
    return out


ALONE = [("nvjet_gemm", 10.0), ("_add_rms_norm_kernel", 4.0), ("_decode_partial_kernel", 20.0)]
BESIDE = [("nvjet_gemm", 12.0), ("_add_rms_norm_kernel", 4.0), ("_decode_partial_kernel", 26.0)]


def test_summary_and_growth_of_synthetic_replays():
    alone = [_replay(0.0, ALONE), _replay(100.0, ALONE)]
    beside = [_replay(0.0, BESIDE, gap=2.0), _replay(100.0, BESIDE, gap=2.0)]
    s = beside_kernels._summary(alone)
    assert s["kernels_per_replay"] == 3 and s["replays"] == 2
    assert s["kernel_ms"] == pytest.approx(0.034) and s["span_ms"] == pytest.approx(0.036)  # two 1-us gaps
    assert s["gap_ms"] == pytest.approx(0.002)
    assert s["by_class_ms"] == {"gemm": pytest.approx(0.010), "other": pytest.approx(0.020),
                                "row_ops": pytest.approx(0.004)}
    grown = beside_kernels._growth(alone, beside)
    assert [(r["index"], r["grew_us"]) for r in grown] == [(2, 6.0), (0, 2.0), (1, 0.0)]
    by_name = beside_kernels._growth_by_name(alone, beside)
    assert by_name[0]["name"] == "_decode_partial_kernel" and by_name[0]["grew_us"] == 6.0


def test_unequal_replays_give_no_growth():
    alone = [_replay(0.0, ALONE)]
    beside = [_replay(0.0, BESIDE[:2])]
    assert beside_kernels._growth(alone, beside) == [] and beside_kernels._growth_by_name(alone, beside) == []


def test_per_replay_splits_evenly_and_kernels_come_from_the_trace(tmp_path):
    ks = _replay(0.0, ALONE) + _replay(100.0, ALONE)
    replays = beside_kernels._per_replay(ks, 2)
    assert [len(r) for r in replays] == [3, 3] and replays[1][0]["ts"] == 100.0
    assert beside_kernels._per_replay([], 2) == []

    class Prof:
        def export_chrome_trace(self, path):
            events = [{"ph": "X", "cat": "kernel", "name": "b", "ts": 5.0, "dur": 1.0, "args": {"stream": 3}},
                      {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1.0, "dur": 1.0},
                      {"ph": "X", "cat": "kernel", "name": "a", "ts": 2.0, "dur": 2.0, "args": {"stream": 4}}]
            Path(path).write_text(json.dumps({"traceEvents": events}))

    assert beside_kernels._kernels(Prof()) == [{"name": "a", "ts": 2.0, "dur": 2.0, "stream": 4},
                                               {"name": "b", "ts": 5.0, "dur": 1.0, "stream": 3}]
