"""benchmarks/admission_pacing_model.py, on sets small enough to follow by hand: a request's prompt in one step (its
last row gives the first token), then a decode row per step; admission stops at the first request whose
reservation does not fit, or (paced) at the cap on admitted requests; a step costs its weights' read (these rows
are far below the GEMMs' knee), its decode rows' K/V and the overhead."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "admission_pacing_model.py"
COST = dict(weight_tbps=2.0, gemm_tflops=600.0, attn_tbps=1.0, overhead_ms=1.0)


def _model():
    spec = importlib.util.spec_from_file_location("admission_pacing_model", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_steps_and_time_follow_by_hand():
    m = _model()
    one = m.simulate([(2, 3)], seats=4, kv_positions=100, max_rows=64, max_running=None, **COST)
    # step 1: the prompt's 2 rows (first token); steps 2-3: decode rows reading 3 then 4 positions
    assert one["steps"] == 3
    floor = m.WEIGHT_BYTES / 2.0e12
    assert one["seconds"] == pytest.approx(3 * (floor + 1e-3) + (3 + 4) * m.KV_BYTES_PER_POSITION / 1e12, abs=1e-3)
    both = m.simulate([(2, 3), (1, 1)], seats=4, kv_positions=100, max_rows=64, max_running=None, **COST)
    assert both["steps"] == 3  # the one-token request ends with its prompt, in step 1
    # a store that holds one reservation, or a cap of one admitted request: the second waits for the first
    short = m.simulate([(2, 3), (1, 1)], seats=4, kv_positions=5, max_rows=64, max_running=None, **COST)
    paced = m.simulate([(2, 3), (1, 1)], seats=4, kv_positions=100, max_rows=64, max_running=1, **COST)
    assert short["steps"] == paced["steps"] == 4
    assert short["output_tok_s"] < both["output_tok_s"]
