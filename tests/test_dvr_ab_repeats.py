"""benchmarks/device/dvr_ab.py's ``--repeats``: every (variant, mode) served again with the variants' order reversed
on every other repeat (ABBA), each repeat's ratio against that repeat's nondet, the medians over complete repeats,
and the contract across repeats (a variant commits its first repeat's deterministic outputs). A CPU run of the
script on the tiny model: the order alternates, every repeat is recorded, the summary counts them, and the outputs
of every repeat were compared (some requests finished in each, so the check is not vacuous).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from tests.helpers import run_dvr_ab

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "device" / "dvr_ab.py"


def test_repeats_alternate_the_order_and_agree_on_committed_outputs(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("dvr_ab_script", SCRIPT)
    dvr_ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dvr_ab)
    out = tmp_path / "ab.json"
    monkeypatch.setattr(sys, "argv", [
        "dvr_ab.py", "--model", "tiny", "--out", str(out), "--variants", "default,w16", "--modes", "nondet,dvr@50",
        "--num-requests", "6", "--max-num-seqs", "16", "--max-fast-tokens", "64", "--budget-s", "400",
        "--warmup-requests", "0", "--repeats", "2"])
    dvr_ab.main()
    got = json.loads(out.read_text())
    for v in ("default", "w16"):
        rows = got["repeats"][v]["dvr@50"]
        assert [r["repeat"] for r in rows] == [1, 2]
        summary = got["repeat_summary"][v]["dvr@50"]
        assert summary["n"] + summary["n_cut"] == 2
    # ABBA: the first variant runs first in repeat 1 and last in repeat 2
    assert [r["position_in_mode"] for r in got["repeats"]["default"]["nondet"]] == [0, 1]
    assert [r["position_in_mode"] for r in got["repeats"]["w16"]["nondet"]] == [1, 0]
    checks = got["repeats_identical"]
    assert set(checks) == {"default_dvr@50_repeat2", "w16_dvr@50_repeat2"}
    for check in checks.values():
        assert check["num_checked"] > 0 and check["num_identical"] == check["num_checked"]
    assert got["runs"]["default"]["dvr@50"]["deterministic_digests"]  # the first repeat keeps the full record


def test_dvr_ab_stops_when_its_first_run_is_cut(tmp_path, monkeypatch):
    """A share of --budget-s too small for the first run: the script says so and stops (every later run would be
    cut, and a device call's time with it); ``--keep-going-when-cut`` runs everything anyway (the negative control)."""
    stopped = run_dvr_ab(tmp_path / "cut.json", monkeypatch, "default,order_budget", "--budget-s", "0.02")
    assert stopped["stopped"]["requests_finished"] < stopped["stopped"]["requests"] == 8
    assert list(stopped["runs"]) == ["default"] and list(stopped["runs"]["default"]) == ["nondet"]
    assert "deterministic_outputs_identical" not in stopped
    went_on = run_dvr_ab(tmp_path / "on.json", monkeypatch, "default,order_budget", "--budget-s", "0.02",
                         "--keep-going-when-cut")
    assert "stopped" not in went_on
    assert {v: sorted(m) for v, m in went_on["runs"].items()} == {v: ["dvr@50", "nondet"]
                                                                  for v in ("default", "order_budget")}


def test_online_repeats_serve_the_variants_in_turn_and_take_the_median_ratio(tmp_path, monkeypatch, capsys):
    """``--online-repeats 2``: every variant's online modes served twice to the same arrivals, the variants' order
    reversed on the second repeat; ``runs`` holds the first repeat, ``repeats`` both, and the median of each free ITL
    ratio over the repeats is reported per variant."""
    import statistics

    got = run_dvr_ab(tmp_path / "ab.json", monkeypatch, "default,split_pass_steps", "--online-load", "0.5",
                     "--online-requests", "6", "--online-budget-s", "200", "--online-repeats", "2",
                     "--num-requests", "4")
    online = got["online"]
    assert online["is_partial"] is False  # the last run landed: the whole record (round 42)
    printed = capsys.readouterr().out.splitlines()
    order = [line.split("online ", 1)[1] for line in printed
             if line.startswith("[dvr_ab] online ") and " (repeat " in line]
    # each run's deterministic latencies beside the free ones (round 42); nondet's runs pass nothing
    latencies = [line for line in printed if "deterministic ITL p50" in line]
    assert len(latencies) == 8 and sum("passes 0 (0 with prompts)" in line for line in latencies) == 4
    assert order == ["default nondet (repeat 1)", "default dvr@50 (repeat 1)", "split_pass_steps nondet (repeat 1)",
                     "split_pass_steps dvr@50 (repeat 1)", "split_pass_steps nondet (repeat 2)",
                     "split_pass_steps dvr@50 (repeat 2)", "default nondet (repeat 2)", "default dvr@50 (repeat 2)"]
    for v in ("default", "split_pass_steps"):
        entries = online["repeats"][v]["dvr@50"]
        assert len(entries) == 2 and online["runs"][v]["dvr@50"] is not None
        assert online["runs"][v]["dvr@50"]["free_itl_s"] == entries[0]["free_itl_s"]
        for key in ("free_itl_over_nondet", "free_itl_at_return_over_nondet"):  # the latter: round 37's old clock
            median = online[f"median_{key}"][v]["dvr@50"]
            for q, value in median.items():
                assert value == statistics.median(e[key][q] for e in entries)
            assert "p50" in median
        for e in entries:  # tokens handed over mid-step never arrive later than the step's return
            assert e["free_itl_s"]["mean"] is not None and e["free_itl_at_return_s"]["mean"] is not None


def test_online_runs_land_in_the_json_as_they_finish(tmp_path, monkeypatch):
    """A device call's cap kills dvr_ab.py mid-way (round 42 lost two calls' online records so): every online run is
    written to ``--out`` as it lands, marked ``is_partial`` until the last. Here the second run is interrupted: the
    first is in the JSON (the complete run's record, not partial, is checked in the repeats test above)."""
    spec = importlib.util.spec_from_file_location("dvr_ab_script", SCRIPT)
    dvr_ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dvr_ab)
    served = []
    real_entry = dvr_ab._online_entry

    def entry_then_cut(*args, **kwargs):
        if served:
            raise KeyboardInterrupt  # as the call's `timeout` would stop it
        served.append(args[2])
        return real_entry(*args, **kwargs)

    monkeypatch.setattr(dvr_ab, "_online_entry", entry_then_cut)
    out = tmp_path / "cut.json"
    monkeypatch.setattr(sys, "argv", [
        "dvr_ab.py", "--model", "tiny", "--out", str(out), "--variants", "default", "--modes", "nondet",
        "--num-requests", "4", "--max-num-seqs", "16", "--max-fast-tokens", "64", "--budget-s", "400",
        "--warmup-requests", "0", "--online-load", "0.5", "--online-requests", "4", "--online-budget-s", "200"])
    try:
        dvr_ab.main()
    except KeyboardInterrupt:
        pass
    else:
        raise AssertionError("the second online run was to be interrupted")
    online = json.loads(out.read_text())["online"]
    assert online["is_partial"] is True and served == ["nondet"]
    assert list(online["repeats"]["default"]) == ["nondet"] and online["runs"]["default"]["nondet"]["is_complete"]
