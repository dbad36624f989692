"""benchmarks/cpu_host_step.py on a few requests: the legacy views and decode-row check it times against round 26's
give the same views and accept the same plan, and every timed part of a step was reached (non-vacuous: requests of
both kinds running, passes applied)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "cpu_host_step.py"


def test_the_host_step_benchmark_compares_equal_views_and_times_every_part(tmp_path):
    spec = importlib.util.spec_from_file_location("cpu_host_step_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = module.main(["--out", str(tmp_path / "h.json"), "--requests", "24", "--det-shares", "0.5", "--reps", "2",
                       "--steps", "40"])
    case = out["cases"]["24_requests_det_0.5"]
    assert case["running"] == 24
    assert case["views"]["views_equal"] and case["views"]["num_views"] > 0
    assert case["decode_rows_check"]["both_valid"] and case["decode_rows_check"]["num_rows"] > 0
    assert all(ms > 0 for ms in case["step_parts_ms"].values()), case["step_parts_ms"]
