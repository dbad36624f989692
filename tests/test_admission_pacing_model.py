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
    with pytest.raises(ValueError, match="does not fit"):  # a store smaller than a request: never admitted
        m.simulate([(2, 3)], seats=4, kv_positions=4, max_rows=64, max_running=None, **COST)


def test_table_gemm_prices_a_step_at_its_graph_bucket():
    """A measured table: a step costs the table's value at its rows' bucket (rows rounded up to 16, then the next M
    the table has); below the smallest M on a line from the weights' read at no rows; above the largest, the upper
    half's slope per row."""
    m = _model()
    table = {64: 10.0, 128: 12.0, 256: 20.0}
    gemm = m.table_gemm(table, weight_tbps=2.0)
    floor = 1e3 * m.WEIGHT_BYTES / 2.0e12
    assert gemm(0) == pytest.approx(floor)
    assert gemm(32) == pytest.approx(floor + (10.0 - floor) / 2)
    assert gemm(64) == 10.0 and gemm(65) == 12.0 and gemm(128) == 12.0 and gemm(200) == 20.0
    assert gemm(256 + 64) == pytest.approx(20.0 + 64 * (20.0 - 12.0) / 128)
    with pytest.raises(ValueError, match="empty"):
        m.table_gemm({}, weight_tbps=2.0)
    # simulate with the table: the same steps as the roofline, priced by the table
    lengths = [(2, 3), (1, 1)]
    shape = dict(seats=4, kv_positions=100, max_rows=64, max_running=None)
    by_table = m.simulate(lengths, **shape, **COST, gemm_table=table)
    steps = m.schedule(lengths, **shape)
    assert by_table["steps"] == len(steps) == 3
    expected = sum(gemm(s.rows) / 1e3 + s.kv_positions * m.KV_BYTES_PER_POSITION / 1e12 + 1e-3 for s in steps)
    assert by_table["seconds"] == pytest.approx(expected, abs=1e-3)


def test_the_engine_trace_runs_every_row_and_matches_the_model_where_the_store_holds_the_set():
    """``engine_trace`` records the engine's own steps: every prompt row once, a decode row per output token after
    the first (a prompt's last row samples it); with a store that holds the whole set the engine admits all at once,
    as the model does, and runs the model's steps (the engine may add one step at the end: its one-step lag). With a
    store of a few requests the two differ (the engine frees a finished request's reservation a step later): the
    comparison can fail."""
    from llm42.bench.workloads import sharegpt_like

    m = _model()
    workload = sharegpt_like(60, length_scale=0.1, vocab_size=64, seed=1)
    lengths = [(len(r.prompt), r.max_new_tokens) for r in workload.requests]
    shape = dict(seats=64, max_rows=128)
    engine = m.engine_trace(lengths, kv_positions=10**6, **shape)
    assert sum(s.prompt_rows for s in engine) == sum(p for p, _ in lengths)
    assert sum(s.decode_rows for s in engine) == sum(o - 1 for _, o in lengths)
    model = m.schedule(lengths, kv_positions=10**6, max_running=None, **shape)
    assert len(model) <= len(engine) <= len(model) + 1
    assert engine[:len(model)] == model
    tight = m.engine_trace(lengths, kv_positions=900, **shape)
    assert tight != m.schedule(lengths, kv_positions=900, max_running=None, **shape)
