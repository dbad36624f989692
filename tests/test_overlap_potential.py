"""benchmarks/device/overlap_potential.py runs end to end on the CPU (``--smoke``: a tiny shape, the fast decode
attention under the Triton interpreter, in a subprocess as the interpreter is chosen when the kernels are
defined) and writes every figure a GPU run reads: a device script that first fails on the card wastes a call."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_overlap_potential_smoke_writes_each_case(tmp_path):
    if importlib.util.find_spec("triton") is None:
        pytest.skip("Triton is not installed (CPU torch does not ship it)")
    out = tmp_path / "o.json"
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "device" / "overlap_potential.py"), "--out",
                           str(out), "--smoke", "--batches", "4"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = json.loads(out.read_text())
    row = got["batches"]["4"]
    assert set(row["ms"]) == {"gemm", "gemm_halves", "attention", "serial"}  # the stream cases need CUDA
    assert all(ms > 0 for ms in row["ms"].values())
    assert row["num_seqs"] == 4 and row["splits"] >= 1
