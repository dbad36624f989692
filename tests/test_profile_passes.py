"""``benchmarks/device/profile_passes.py`` on the CPU (the tiny model, 2 layers, one rep): with ``--canonical-slices
2`` every pass row gives its two slices' times, which with the sampler make up the pass; ``--host-profile`` gives
the 8-window launch's host time by function; the launch-only and replay-only host times are there."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "device" / "profile_passes.py"


def test_profile_passes_times_each_slice_and_profiles_the_launch(tmp_path):
    out = tmp_path / "passes.json"
    subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--device", "cpu", "--layers", "2",
                    "--canonical-slices", "2", "--reps", "1", "--warmup", "0", "--max-canonical-tokens", "256",
                    "--context", "16", "--seqs", "64", "--host-profile"], check=True, capture_output=True, timeout=600)
    got = json.loads(out.read_text())
    assert [r["windows"] for r in got["verify_windows"]] == [1, 4, 8]
    for row in got["verify_windows"] + got["prompt_chunks"]:
        assert len(row["slice_device_ms"]) == 2 and all(ms > 0 for ms in row["slice_device_ms"])
        assert row["launch_host_ms"]["median"] > 0 and row["replay_host_ms"]["median"] > 0
    profile = got["host_profile"]["8_windows"]
    assert profile and all(r["calls"] > 0 for r in profile)
