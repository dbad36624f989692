"""``benchmarks/tradeoff_plot.py``: each configuration's point is read from the device calls' JSON it names (never
typed in), a configuration whose run is missing is left out, and ``meets_both`` is the targets' test."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import tradeoff_plot  # noqa: E402


def _write(path: Path, runs: dict, online: dict | None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"runs": runs, **({"online": {"runs": online}} if online is not None else {})}))


def test_points_come_from_the_named_files_and_the_targets_are_tested(tmp_path, monkeypatch):
    _write(tmp_path / "a.json", {"x": {"dvr@50": {"ratio_to_nondet": 0.83}}, "y": {"dvr@50": {"ratio_to_nondet": 0.9}}},
           {"x": {"dvr@50": {"free_itl_over_nondet": {"p50": 1.1, "p99": 1.12}}},
            "y": {"dvr@50": [{"free_itl_over_nondet": {"p50": 1.1, "p99": 1.14}},
                             {"free_itl_over_nondet": {"p50": 1.2, "p99": 1.1}}]}})
    _write(tmp_path / "b.json", {"x": {"dvr@50": {"ratio_to_nondet": 0.79}}}, None)  # no online runs
    monkeypatch.setattr(tradeoff_plot, "SOURCES", {"x": ("x", "a.json", "x", "a.json"),
                                                   "y": ("y", "a.json", "y", "a.json"),
                                                   "x offline only": ("x", "b.json", "x", "b.json")})
    assert tradeoff_plot.main(["--out", str(tmp_path / "out" / "t")], repo=tmp_path) == 0
    got = json.loads((tmp_path / "out" / "t.json").read_text())["points"]
    assert [p["label"] for p in got] == ["x", "y"]  # the one without online runs is left out
    x, y = got
    assert (x["offline_dvr50"], x["online_p50"], x["online_p99"], x["meets_both"]) == (0.83, [1.1], [1.12], True)
    assert y["online_p50"] == [1.1, 1.2] and not y["meets_both"]  # control: one repeat over 1.15x fails it
    assert (tmp_path / "out" / "t.png").stat().st_size > 0


def test_the_repository_points_match_their_files():
    """The committed figure's sources are there, and each point is its files' figures."""
    for label, src in tradeoff_plot.SOURCES.items():
        pt = tradeoff_plot.point(label, src)
        assert pt is not None, label
        offline = json.loads((REPO / src[1]).read_text())["runs"][src[0]]["dvr@50"]["ratio_to_nondet"]
        assert pt["offline_dvr50"] == offline


def test_one_call_plots_each_variant_with_every_online_repeat(tmp_path):
    """``--json``: every variant of one call, online figures from its ``repeats`` (all of them), not the first run's
    alone; a variant served offline only is left out."""
    call = tmp_path / "call.json"
    call.write_text(json.dumps({
        "runs": {"a": {"dvr@50": {"ratio_to_nondet": 0.81}}, "b": {"dvr@50": {"ratio_to_nondet": 0.76}},
                 "c": {"dvr@50": {"ratio_to_nondet": 0.9}}},
        "online": {"runs": {"a": {"dvr@50": {"free_itl_over_nondet": {"p50": 1.1, "p99": 1.1}}},
                            "b": {"dvr@50": {"free_itl_over_nondet": {"p50": 1.3, "p99": 1.3}}}},
                   "repeats": {"a": {"dvr@50": [{"free_itl_over_nondet": {"p50": 1.1, "p99": 1.1}},
                                                {"free_itl_over_nondet": {"p50": 1.16, "p99": 1.1}}]},
                               "b": {"dvr@50": [{"free_itl_over_nondet": {"p50": 1.3, "p99": 1.3}},
                                                {"free_itl_over_nondet": {"p50": 1.2, "p99": 1.25}}]}}}}))
    assert tradeoff_plot.main(["--json", str(call), "--out", str(tmp_path / "t"), "--title", "x"],
                              repo=tmp_path) == 0
    got = {p["label"]: p for p in json.loads((tmp_path / "t.json").read_text())["points"]}
    assert set(got) == {"a", "b"}  # c: no online run
    assert got["a"]["online_p50"] == [1.1, 1.16] and not got["a"]["meets_both"]  # its second repeat misses p50
    assert got["b"]["online_p99"] == [1.3, 1.25] and got["a"]["offline_file"] == "call.json"
