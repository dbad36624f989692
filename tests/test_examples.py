"""Every example runs as documented: the scripts (in-process, as ``__main__``) and the determinism suite
(pytest in a subprocess, with llm42's plugin providing its fixture)."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"



def run_example(name: str, capsys) -> str:
    runpy.run_path(str(EXAMPLES / name), run_name="__main__")
    return capsys.readouterr().out


def test_quickstart_runs_and_shows_batch_independence(capsys):
    out = run_example("quickstart.py", capsys)
    assert "'Once upon a time' -> '" in out
    assert "alone == in a batch of 3: True" in out
    assert "online: '" in out and "stats: {" in out


def test_mixed_traffic_runs_and_every_deterministic_request_matches(capsys):
    out = run_example("mixed_traffic.py", capsys)
    assert "[canonical pass]" in out
    assert "all deterministic requests match their batch-size-1 reference" in out
    assert "canonical passes using" in out


def test_custom_scheduler_example_matches_its_references(capsys):
    out = run_example("custom_scheduler.py", capsys)
    lines = [line for line in out.splitlines() if line.startswith("request ")]
    assert len(lines) == 2 and all("identical to its batch-size-1 reference: True" in line for line in lines)


def test_rl_parity_example_sees_bit_identical_log_probs_every_step(capsys):
    out = run_example("rl_parity.py", capsys)
    steps = [line for line in out.splitlines() if line.startswith("step ")]
    assert len(steps) == 3 and all("bit for bit: True; max |ratio - 1| = 0.0;" in line for line in steps)
    assert "after update_weights == a fresh generator on the new weights: True" in out


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.py")))
def test_every_example_script_is_covered(name):
    assert name in {"quickstart.py", "mixed_traffic.py", "custom_scheduler.py", "rl_parity.py"}, \
        f"add a smoke test for {name}"


def test_determinism_suite_passes_with_the_plugin_fixture(tmp_path):
    # cwd is a scratch dir so hypothesis' example database lands there, not in the repository
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(EXAMPLES / "determinism_suite")],
        check=False, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = result.stdout.strip().splitlines()[-1]
    assert "3 passed" in summary and "failed" not in summary
