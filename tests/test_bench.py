"""The benchmark harness on the CPU: well-formed results, and its determinism claim checked.

One small suite run (every mode, offline, online and a sweep) is shared by
the tests below; the workload, mode and metric helpers are checked on their own.
"""

from __future__ import annotations

import importlib.util
import json
import math
import statistics
import time
from pathlib import Path

import pytest
import torch

from llm42.bench import (
    SHAREGPT_INPUT,
    SHAREGPT_OUTPUT,
    Engine,
    Scale,
    SuiteConfig,
    all_modes,
    build_model,
    deterministic_order,
    fixed_shape,
    mode_by_name,
    percentile,
    plot_all,
    poisson_arrivals,
    run_offline,
    run_suite,
    sharegpt_like,
    summarize,
)
from llm42.bench.metrics import determinism_check
from llm42.bench.modes import deterministic_indices
from llm42.policies import NoisyFastPolicy

REPO = Path(__file__).resolve().parent.parent
MODE_NAMES = ["nondet", "dvr@5", "dvr@10", "dvr@20", "dvr@50", "dvr@100", "batch_invariant", "no_batching"]
TEST_SCALE = Scale(
    name="test", window=8, group=2, num_requests=4, length_scale=1 / 16, fixed_shapes=((1024, 256),),
    online_loads=(0.5,), online_modes=("nondet", "dvr@50", "dvr@100", "batch_invariant"), online_num_requests=4,
    sweep_windows=(4, 8), sweep_groups=(1, 2), sweep_mode="dvr@100", sweep_num_requests=4,
    no_batching_max_requests=4, bi_check_requests=2, budget_s=600.0,
)



@pytest.fixture(scope="module")
def results() -> dict:
    config = SuiteConfig(device="cpu", model="tiny", dtype=torch.float32, scale=TEST_SCALE)
    return run_suite(config, progress=False, repo=REPO)


# -- the suite's results ---------------------------------------------------------------------------

def test_suite_runs_every_mode_on_every_workload(results):
    assert results["skipped"] == [] and results["errors"] == {}
    assert list(results["offline"]) == ["sharegpt", "fixed_1024x256"]
    for entry in results["offline"].values():
        assert list(entry["modes"]) == MODE_NAMES
        for summary in entry["modes"].values():
            assert summary["is_complete"]
            assert summary["num_finished"] == summary["num_requests"]
            assert summary["output_tokens_per_s"] > 0
            assert summary["ratio_to_nondet"] == pytest.approx(
                summary["output_tokens_per_s"] / entry["modes"]["nondet"]["output_tokens_per_s"])
        assert entry["modes"]["nondet"]["ratio_to_nondet"] == 1.0
        assert entry["modes"]["nondet"]["num_deterministic"] == 0
        assert entry["modes"]["dvr@100"]["num_deterministic"] == TEST_SCALE.num_requests
        assert entry["modes"]["dvr@5"]["num_deterministic"] == 1  # a share > 0 always gets one request


def test_deterministic_outputs_of_every_dvr_mode_equal_the_no_batching_outputs(results):
    """The benchmark's determinism claim: dvr@p deterministic requests == the one-at-a-time reference."""
    for workload, entry in results["offline"].items():
        full = entry["modes"]["dvr@100"]["determinism"]
        assert full["num_checked"] == TEST_SCALE.num_requests, workload
        assert full["num_identical"] == full["num_checked"], workload
        for mode in ("dvr@5", "dvr@10", "dvr@20", "dvr@50"):
            det = entry["modes"][mode]["determinism"]
            assert det["num_checked"] == entry["modes"][mode]["num_deterministic"]
            assert det["mismatched_requests"] == []
    totals = results["checks"]["determinism"]
    assert totals["is_ok"] and totals["num_checked"] > 0


def test_batch_invariant_outputs_equal_the_same_requests_run_alone(results):
    check = results["checks"]["batch_invariance"]
    assert check["num_checked"] == TEST_SCALE.bi_check_requests
    assert check["num_identical"] == check["num_checked"]


def test_online_runs_report_latency_percentiles_and_nondet_comparison(results):
    (entry,) = results["online"].values()
    assert entry["rate_rps"] == pytest.approx(0.5 * entry["capacity_rps"])
    assert list(entry["modes"]) == list(TEST_SCALE.online_modes)
    for mode, summary in entry["modes"].items():
        for metric in ("ttft_s", "e2e_s"):
            p = summary["latency"][metric]
            assert 0 <= p["p50"] <= p["p90"] <= p["p99"], (mode, metric, p)
        assert len(summary["e2e_s_values"]) == TEST_SCALE.online_num_requests
    versus = entry["modes"]["dvr@50"]["nondet_requests_vs_nondet_run"]
    assert versus["num_requests"] == 2 and versus["e2e_p50_ratio"] > 0
    assert "nondet_requests_vs_nondet_run" not in entry["modes"]["dvr@100"]  # it has no such requests


def test_sweep_covers_the_window_group_grid(results):
    points = results["sweep"]["points"]
    assert [(p["window"], p["group"]) for p in points] == [(4, 1), (4, 2), (8, 1), (8, 2)]
    for p in points:
        assert p["rows"] == p["window"] * p["group"]
        assert p["ratio_to_nondet"] > 0 and p["recompute_share"] >= 0


def test_results_record_the_run_and_serialise(results):
    meta = results["meta"]
    assert "NOT representative" in results["label"]
    assert meta["device"]["type"] == "cpu" and meta["model"]["name"] == "tiny"
    assert (meta["window"], meta["group"]) == (TEST_SCALE.window, TEST_SCALE.group)
    assert meta["git"]["commit"] is None or len(meta["git"]["commit"]) == 40
    assert json.loads(json.dumps(results)) == results


def test_results_plot_into_three_pngs(results, tmp_path):
    pytest.importorskip("matplotlib")
    paths = plot_all(results, tmp_path, "test")
    assert sorted(p.name for p in paths) == ["test_latency_cdf.png", "test_sweep.png", "test_throughput.png"]
    assert all(p.stat().st_size > 1000 for p in paths)


# -- rollbacks are counted, and do not change committed outputs -------------------------------------

def test_forced_rollbacks_are_counted_and_outputs_still_equal_the_reference():
    workload = fixed_shape(64, 48, 3, length_scale=1.0, vocab_size=512, seed=1)
    model = build_model("tiny", device=torch.device("cpu"), dtype=torch.float32, max_positions=256)
    order = deterministic_order(workload.num_requests, seed=0)
    plain = Engine(model, window=8, group=2, kv_cache_tokens=1024)
    noisy = Engine(model, window=8, group=2, kv_cache_tokens=1024, fast_policy=NoisyFastPolicy(scale=3.0, seed=0))
    reference = run_offline(plain, workload, mode_by_name("no_batching"), det_order=order, deadline=math.inf)
    run = run_offline(noisy, workload, mode_by_name("dvr@100"), det_order=order, deadline=math.inf)
    summary = summarize(run, reference={r.index: r.token_ids for r in reference.records})
    assert summary["rollbacks_per_request"] > 0
    assert summary["recompute_share"] > 0
    assert summary["recomputed_tokens"] == run.stats["recomputed_tokens"]
    assert summary["determinism"]["num_identical"] == workload.num_requests


def test_determinism_check_reports_a_mismatch():
    workload = fixed_shape(8, 4, 2, length_scale=1.0, vocab_size=512)
    model = build_model("tiny", device=torch.device("cpu"), dtype=torch.float32, max_positions=64)
    run = run_offline(Engine(model, window=4, group=2, kv_cache_tokens=256), workload, mode_by_name("dvr@100"),
                      det_order=[0, 1], deadline=math.inf)
    wrong = {r.index: r.token_ids for r in run.records}
    wrong[1] = [t + 1 for t in wrong[1]]
    assert determinism_check(run, wrong) == {"num_checked": 2, "num_identical": 1, "mismatched_requests": [1]}


# -- workloads, modes, metrics -------------------------------------------------------------------------

def test_sharegpt_like_lengths_follow_the_stated_log_normals():
    workload = sharegpt_like(3000, length_scale=1.0, vocab_size=1000, seed=0)
    inputs = [len(r.prompt) for r in workload.requests]
    outputs = [r.max_new_tokens for r in workload.requests]
    assert SHAREGPT_INPUT.low <= min(inputs) and max(inputs) <= SHAREGPT_INPUT.high
    assert SHAREGPT_OUTPUT.low <= min(outputs) and max(outputs) <= SHAREGPT_OUTPUT.high
    assert statistics.median(inputs) == pytest.approx(SHAREGPT_INPUT.median, rel=0.1)
    assert statistics.median(outputs) == pytest.approx(SHAREGPT_OUTPUT.median, rel=0.1)
    assert all(3 <= t < 1000 for r in workload.requests[:50] for t in r.prompt)
    assert 0.4 < sum(r.is_greedy for r in workload.requests) / 3000 < 0.6


def test_workloads_are_pure_functions_of_their_arguments():
    a = sharegpt_like(20, length_scale=0.5, vocab_size=300, seed=4)
    assert a == sharegpt_like(20, length_scale=0.5, vocab_size=300, seed=4)
    assert a != sharegpt_like(20, length_scale=0.5, vocab_size=300, seed=5)
    assert a.head(5).requests == a.requests[:5]


def test_with_top_p_gives_the_asked_sampled_requests_top_p_and_their_params_carry_it():
    from llm42.bench.modes import sampling_params

    base = sharegpt_like(40, length_scale=0.5, vocab_size=300, seed=4)
    workload = base.with_top_p(5, 0.9, seed=1)
    changed = [r for r, b in zip(workload.requests, base.requests) if r != b]
    assert len(changed) == 5 and all(r.top_p == 0.9 and not r.is_greedy for r in changed)
    assert workload == base.with_top_p(5, 0.9, seed=1) and workload != base.with_top_p(5, 0.9, seed=2)
    assert workload.summary()["num_top_p"] == 5 and base.summary()["num_top_p"] == 0
    assert sampling_params(changed[0], is_deterministic=False).top_p == pytest.approx(0.9)
    assert sampling_params(base.requests[0], is_deterministic=False).top_p == 1.0
    with pytest.raises(ValueError, match="num_requests"):
        base.with_top_p(41, 0.9)
    with pytest.raises(ValueError, match="top_p"):
        base.with_top_p(1, 1.0)


def test_fixed_shape_scales_the_paper_shape():
    workload = fixed_shape(4096, 1024, 3, length_scale=1 / 32, vocab_size=100)
    assert {(len(r.prompt), r.max_new_tokens) for r in workload.requests} == {(128, 32)}
    assert workload.name == "fixed_4096x1024"


def test_poisson_arrivals_have_the_asked_rate():
    times = poisson_arrivals(4000, 20.0, seed=1)
    gaps = [b - a for a, b in zip([0.0] + times, times)]
    assert all(g > 0 for g in gaps)
    assert statistics.mean(gaps) == pytest.approx(1 / 20.0, rel=0.05)


def test_deterministic_sets_grow_with_the_share():
    order = deterministic_order(40, seed=3)
    sets = [deterministic_indices(mode_by_name(f"dvr@{p}"), order) for p in (5, 10, 20, 50, 100)]
    assert [len(s) for s in sets] == [2, 4, 8, 20, 40]
    assert all(small <= large for small, large in zip(sets, sets[1:]))
    assert [m.name for m in all_modes()] == MODE_NAMES


def test_percentile_matches_linear_interpolation():
    values = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert percentile(values, 50) == 3.0
    assert percentile(values, 90) == pytest.approx(4.6)
    assert percentile([], 50) is None


@pytest.mark.parametrize("name", ["dvr@0", "dvr@101", "fast"])
def test_unknown_modes_are_rejected(name):
    with pytest.raises(ValueError):
        mode_by_name(name)


# -- the command line ------------------------------------------------------------------------------------

def load_run_all():
    spec = importlib.util.spec_from_file_location("run_all", REPO / "benchmarks" / "run_all.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_8b_shape_is_llama31_8b_with_the_context_the_workloads_need():
    import llm42.model.config as config_module
    from llm42.bench.models import llama31_8b_shape

    if not hasattr(config_module, "llama31_8b_config"):
        pytest.skip("this checkout has no llama31_8b_config")
    cfg = llama31_8b_shape(1280)
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads,
            cfg.vocab_size) == (4096, 14336, 32, 32, 8, 128256)
    assert cfg.max_position_embeddings == 1280


def test_8b_model_without_its_config_fails_clearly(monkeypatch, capsys, tmp_path):
    import llm42.model.config as config_module

    monkeypatch.delattr(config_module, "llama31_8b_config", raising=False)
    code = load_run_all().main(["--model", "8b", "--out", str(tmp_path), "--no-progress"])
    assert code == 2
    assert "llama31_8b_config" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_a_failing_run_is_recorded_and_the_suite_goes_on(monkeypatch):
    import llm42.bench.suite as suite_module

    def broken(*args, **kwargs):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(suite_module, "run_offline", broken)
    scale = TEST_SCALE.with_overrides(sweep_windows=(4,), sweep_groups=(1,))
    results = run_suite(SuiteConfig(device="cpu", model="tiny", dtype=torch.float32, scale=scale,
                                    phases=("sweep",)), progress=False, repo=REPO)
    assert results["errors"] == {"sweep nondet": "RuntimeError: kernel exploded",
                                 "sweep T=4 G=1": "RuntimeError: kernel exploded"}
    assert results["sweep"]["points"] == [] and results["offline"] == {}


def test_replot_redraws_a_saved_run(results, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps(results))
    assert load_run_all().main(["--replot", str(saved)]) == 0
    assert sorted(p.name for p in tmp_path.glob("*.png")) == [
        "saved_latency_cdf.png", "saved_sweep.png", "saved_throughput.png"]
    assert "| sharegpt | dvr@100 |" in capsys.readouterr().out


def test_replot_without_matplotlib_exits_non_zero_saying_why(results, tmp_path, capsys, monkeypatch):
    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps(results))
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "matplotlib" else real_find_spec(name, *args))
    assert load_run_all().main(["--replot", str(saved)]) == 1
    assert "matplotlib is not installed, so nothing was drawn" in capsys.readouterr().err
    assert list(tmp_path.glob("*.png")) == []


def test_replot_of_a_run_with_nothing_to_plot_exits_non_zero_saying_why(results, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    saved = tmp_path / "empty.json"
    saved.write_text(json.dumps({**results, "offline": {}, "online": {}, "sweep": {}}))
    assert load_run_all().main(["--replot", str(saved)]) == 1
    assert "no offline, sweep or online results to plot" in capsys.readouterr().err
    assert list(tmp_path.glob("*.png")) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_cuda_device_without_cuda_fails_clearly(capsys, tmp_path):
    code = load_run_all().main(["--device", "cuda", "--out", str(tmp_path), "--no-progress"])
    assert code == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_a_runs_budget_starts_at_its_first_request():
    # budget_s bounds the timed run alone: the generator's build before it is not counted, the deadline still
    # bounds the whole call. A zero budget serves nothing (control: the same run with room finishes every request)
    workload = fixed_shape(8, 4, 2, length_scale=1.0, vocab_size=512)
    model = build_model("tiny", device=torch.device("cpu"), dtype=torch.float32, max_positions=64)
    engine = Engine(model, window=4, group=2, kv_cache_tokens=256)
    cut = run_offline(engine, workload, mode_by_name("dvr@50"), det_order=[0, 1], deadline=math.inf, budget_s=0.0)
    assert not cut.is_complete and not any(r.is_finished for r in cut.records)
    whole = run_offline(engine, workload, mode_by_name("dvr@50"), det_order=[0, 1], deadline=math.inf,
                        budget_s=600.0)
    assert whole.is_complete and all(r.is_finished for r in whole.records)
    past = run_offline(engine, workload, mode_by_name("dvr@50"), det_order=[0, 1], deadline=0.0, budget_s=600.0)
    assert not past.is_complete


def test_a_slow_generator_build_does_not_eat_a_runs_budget(monkeypatch):
    # the build (graph captures, on CUDA) takes 0.5 s here: a 30 s budget from the first request still serves
    # everything; a deadline of 0.4 s from before the build (what dvr_ab passed before round 14) cuts the run
    workload = fixed_shape(8, 4, 2, length_scale=1.0, vocab_size=512)
    model = build_model("tiny", device=torch.device("cpu"), dtype=torch.float32, max_positions=64)
    engine = Engine(model, window=4, group=2, kv_cache_tokens=256)
    build = Engine.generator

    def slow_build(self, *args, **kwargs):
        time.sleep(0.5)
        return build(self, *args, **kwargs)

    monkeypatch.setattr(Engine, "generator", slow_build)
    served = run_offline(engine, workload, mode_by_name("dvr@50"), det_order=[0, 1],
                         deadline=time.perf_counter() + 60.0, budget_s=30.0)
    assert served.is_complete
    cut = run_offline(engine, workload, mode_by_name("dvr@50"), det_order=[0, 1],
                      deadline=time.perf_counter() + 0.4)
    assert not cut.is_complete
