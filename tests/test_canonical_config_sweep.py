"""benchmarks/device/canonical_config_sweep.py's checks, run under Triton's interpreter at tiny sizes.

The sweep ranks candidate canonical attention configurations for the H200; what makes a
candidate admissible is that a row's bits stay its own when the same rows are launched in
other groupings. Here: the current configuration passes that check, and the comparison with the
current configuration's bits does see a difference where the tile height changes (so a zero
there is not vacuous).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from tests.triton_cpu import is_interpreted  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "device" / "canonical_config_sweep.py"


@pytest.mark.skipif(not is_interpreted() and not torch.cuda.is_available(), reason="needs Triton's interpreter")
def test_the_sweep_finds_the_current_config_row_independent_and_sees_a_tile_change():
    spec = importlib.util.spec_from_file_location("canonical_config_sweep", SCRIPT)
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    row = sweep.sweep_length(80, 40, device=device, dtype=torch.float32, reps=1, heads=(4, 2, 16),
                             candidates=[sweep.CURRENT, (32, 32, 4, 2)])
    current = row["configs"]["x".join(map(str, sweep.CURRENT))]
    assert current["rows_differing_when_regrouped"] == 0 and current["rows_differing_from_current"] == 0
    other = row["configs"]["32x32x4x2"]
    assert other["rows_differing_when_regrouped"] == 0
    assert other["rows_differing_from_current"] > 0  # the comparison sees another configuration's bits
    assert row["fast_prefill"]["ms"] > 0
