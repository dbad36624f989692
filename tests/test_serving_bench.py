"""The serving benchmark, the paper-figure benchmark and the kernel benchmark, end to end on the CPU.

Each script runs with a tiny random model in seconds and must write well-formed
JSON whose GPU-only figures are null; the pieces they rest on (the clock that
never synchronises, the roofline arithmetic, the flip-rate probe and its
negative control, the span measure, chat prompts) are checked on their own.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from llm42.bench import build_model
from llm42.bench.figures import first_mismatch
from llm42.bench.flips import flip_rate
from llm42.bench.metrics import CDF_POINTS, RequestRecord, cdf
from llm42.bench.roofline import model_sizes, roofline
from llm42.bench.modes import mode_by_name
from llm42.bench.runner import Clock
from llm42.bench.workloads import chat_like, fixed_shape, sharegpt_like
from llm42.policies import NoisyFastPolicy

REPO = Path(__file__).resolve().parent.parent
CPU = torch.device("cpu")
HAS_PLOTS = importlib.util.find_spec("matplotlib") is not None


def _is_json_clean(value) -> bool:
    return json.loads(json.dumps(value, allow_nan=False)) == value


@pytest.fixture(scope="module")
def serving(tmp_path_factory) -> tuple[int, dict, Path]:
    from llm42.bench.serving import main

    out = tmp_path_factory.mktemp("serving") / "serving_cpu_tiny.json"
    rc = main(["--device", "cpu", "--model", "tiny", "--budget-s", "60", "--num-requests", "6",
               "--max-num-seqs", "6", "--modes", "nondet,nondet_sync,dvr@50,batch_invariant",
               "--online-modes", "nondet,dvr@50", "--online-loads", "0.8", "--online-num-requests", "4",
               "--steady-batch", "4", "--steady-steps", "3", "--out", str(out), "--no-plots"], repo=REPO)
    return rc, json.loads(out.read_text()), out


@pytest.fixture(scope="module")
def figures(tmp_path_factory) -> tuple[int, dict, Path]:
    from llm42.bench.figures import main

    out = tmp_path_factory.mktemp("figures") / "paper_figures_cpu_tiny.json"
    rc = main(["--device", "cpu", "--model", "tiny", "--random-model", "tiny", "--budget-s", "90",
               "--fig9-windows", "4,8", "--fig9-groups", "1,2", "--fig9-requests", "3", "--fig10-requests", "4",
               "--random-figures", "10",
               "--fig6-batch", "4", "--fig6-measured", "2", "--fig6-new-tokens", "8", "--out", str(out),
               "--no-plots"], repo=REPO)
    return rc, json.loads(out.read_text()), out


# -- benchmarks/serving.py ----------------------------------------------------------------------------

def test_serving_runs_every_phase_and_writes_clean_json(serving):
    rc, results, _ = serving
    assert rc == 0 and results["errors"] == {} and results["meta"]["is_complete"]
    assert _is_json_clean(results)
    assert "NOT representative" in results["label"]
    assert results["ceilings"]["copy_GBps"] > 0 and results["ceilings"]["matmul_TFLOPs"] > 0
    offline = results["offline"]
    assert list(offline["modes"]) == ["nondet", "nondet_sync", "dvr@50", "batch_invariant"]
    for name, summary in offline["modes"].items():
        assert summary["is_complete"] and summary["num_finished"] == offline["workload"]["num_requests"], name
        assert summary["engine"]["steps"] > 0 and summary["engine"]["ms_per_step"] > 0
        assert 0 < summary["fraction_of_roofline"] < 1, name  # nothing beats the roofline bound
        assert summary["fraction_of_roofline"] <= summary["fraction_of_serial_bound"], name  # a time bound >= it
        lat = summary["latency_nondeterministic"]
        assert 0 <= lat["itl_s"]["p50"] <= lat["itl_s"]["p99"]
    det = offline["modes"]["dvr@50"]
    assert det["num_deterministic"] == 3 and det["latency_deterministic"]["tpot_s"]["p50"] > 0
    assert det["itl_cdf_deterministic"]["percentiles"] == list(CDF_POINTS)
    assert "free_itl_vs_nondet" in det and "itl_cdf_free" in det
    assert offline["checks"]["deterministic_outputs_agree_across_dvr_modes"]["is_ok"]
    assert results["transformers"] == {"skipped": "needs a checkpoint (--model PATH)"}
    # timed as `llm42 serve` serves: start-up objects frozen out of the collector's full passes
    assert results["meta"]["config"]["gc_freeze"] is True
    (load,) = results["online"]["loads"].values()
    assert list(load["modes"]) == ["nondet", "dvr@50"]
    assert load["rate_rps"] == pytest.approx(0.8 * results["online"]["capacity_rps"])


def test_serving_steady_decode_reports_gpu_figures_as_null_on_the_cpu(serving):
    _, results, _ = serving
    steady = results["steady_decode"]
    assert set(steady) == {"overlap", "no_overlap"}
    for label, s in steady.items():
        assert s["is_complete"] and s["is_overlapped"] == (label == "overlap")
        assert s["decode_rows_per_step"] == s["batch"] == 4  # every timed step was pure decode
        assert s["wall_ms_per_step"] > 0
        assert s["graph_replay_ms"] is None and s["wall_over_kernel"] is None and s["gpu_busy_fraction"] is None


@pytest.mark.skipif(not HAS_PLOTS, reason="matplotlib is not installed")
def test_serving_replot_redraws_from_the_json(serving, tmp_path):
    from llm42.bench.serving import main

    _, results, _ = serving
    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps(results))
    assert main(["--replot", str(saved)]) == 0
    assert sorted(p.name for p in tmp_path.glob("*.png")) == ["saved_itl_cdf.png", "saved_throughput.png"]


def test_serving_engine_takes_the_canonical_gemm_rows_the_gc_switch_and_prompt_drafts():
    from llm42.bench.serving import ServingConfig, _engine, parse_args

    args = parse_args(["--canonical-gemm-rows", "1024", "--no-gc-freeze", "--prompt-drafts"])
    assert args.canonical_gemm_rows == 1024 and args.gc_freeze is False and args.prompt_drafts is True
    assert parse_args([]).gc_freeze is True and parse_args([]).canonical_gemm_rows is None
    model = build_model("tiny", device=CPU, dtype=torch.float32, max_positions=64)
    workload = fixed_shape(8, 4, 2, length_scale=1.0, vocab_size=model.cfg.vocab_size, seed=0, sampled_share=0.0)
    config = ServingConfig(device="cpu", model="tiny", dtype=torch.float32, budget_s=10, window=4, group=2,
                           max_num_seqs=2, canonical_gemm_rows=16, gc_freeze=False, prompt_drafts=True)
    engine = _engine(model, config, workload)
    assert engine.canonical_gemm_rows == 16 and engine.gc_freeze is False and engine.prompt_drafts is True
    gen, _ = engine.generator(mode_by_name("dvr@50"))
    try:
        assert gen.canonical_policy.gemm_rows == 16 and gen.config.prompt_drafts is True
    finally:
        gen.close()


def test_serving_cuda_without_cuda_fails_clearly(capsys, tmp_path):
    from llm42.bench.serving import main

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main(["--device", "cuda", "--out", str(tmp_path / "x.json"), "--budget-s", "5"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


# -- benchmarks/paper_figures.py ----------------------------------------------------------------------

def test_paper_figures_writes_every_section(figures):
    rc, results, _ = figures
    assert rc == 0 and results["errors"] == {} and results["meta"]["is_complete"]
    assert _is_json_clean(results)
    real = results["real"]
    flips = real["flip_rate"]
    assert flips["num_compared"] == flips["greedy"]["num_compared"] + flips["sampled"]["num_compared"] > 0
    assert real["fig6"]["first_span"]["num_measured"] == 2
    points = real["fig9"]["points"]
    assert [(p["window"], p["group"]) for p in points] == [(4, 1), (4, 2), (8, 1), (8, 2)]
    for p in points:
        assert p["pass_ms"] > 0 and p["verify_ms_per_committed_token"] > 0 and p["recompute_share"] >= 0
    modes = real["fig10"]["modes"]
    assert list(modes) == ["nondet", "dvr@10", "dvr@25", "dvr@50", "dvr@100", "batch_invariant", "no_batching"]
    assert real["fig10"]["determinism"]["num_checked"] > 0
    assert real["fig10"]["determinism"]["num_identical"] == real["fig10"]["determinism"]["num_checked"]
    random = results["random"]
    calibration = random["calibration"]
    assert calibration["chosen_lm_head_bias_scale"] in [t["lm_head_bias_scale"] for t in calibration["tried"]]
    assert random["calibrated"]["lm_head_bias_scale"] == calibration["chosen_lm_head_bias_scale"]
    assert random["calibrated"]["lm_head_std"] == calibration["lm_head_std"]
    assert "fig10" in random["calibrated"] and "fig10" in random["worst_case"]
    assert "upper bound" in random["worst_case"]["note"]


@pytest.mark.skipif(not HAS_PLOTS, reason="matplotlib is not installed")
def test_paper_figures_replot_redraws_from_the_json(figures, tmp_path):
    from llm42.bench.figures import main

    _, results, _ = figures
    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps(results))
    assert main(["--replot", str(saved)]) == 0
    names = sorted(p.name for p in tmp_path.glob("*.png"))
    assert {"saved_fig9.png", "saved_fig10.png", "saved_calibration.png"} <= set(names)


# -- benchmarks/gpu_bench.py --------------------------------------------------------------------------

def test_gpu_bench_runs_its_staging_eagerly_on_the_cpu(tmp_path):
    spec = importlib.util.spec_from_file_location("gpu_bench", REPO / "benchmarks" / "gpu_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "kernels.json"
    assert module.main(["--device", "cpu", "--reps", "1", "--out", str(out)]) == 0
    results = json.loads(out.read_text())
    assert results["is_smoke"] and _is_json_clean(results)
    assert [r["batch"] for r in results["decode"]] == [1, 4]
    assert all(r["eager_step_ms"] > 0 and r["graph_replay_ms"] is None for r in results["decode"])
    assert [r["rows"] for r in results["canonical"]] == [8, 16]
    assert all(r["eager_pass_ms"] > 0 and "graph_pass_ms" not in r for r in results["canonical"])


def test_long_prompts_measures_ttft_and_the_free_requests_gaps(tmp_path, capsys):
    from llm42.bench.long_prompts import main

    out = tmp_path / "long_prompts.json"
    assert main(["--device", "cpu", "--model", "tiny", "--window", "4", "--group", "4", "--lengths", "16,40",
                 "--itl-prompt", "40", "--free-batch", "3", "--itl-steps", "3", "--canonical-tile-m", "128",
                 "--out", str(out)], repo=REPO) == 0
    results = json.loads(out.read_text())
    assert _is_json_clean(results) and results["meta"]["is_complete"] and results["errors"] == {}
    assert results["meta"]["config"]["canonical_tile_m"] == 128  # the canonical config the run names
    rows = results["ttft"]
    assert [(r["prompt_tokens"], r["deterministic"]) for r in rows] == [(16, False), (16, True), (40, False),
                                                                          (40, True)]
    assert all(r["ttft_ms"] > 0 and r["ttft_over_roofline"] > 0 for r in rows)
    # a 40-token prompt costs more FLOPs than a 16-token one: the roofline grows with the prompt
    assert rows[2]["prefill_roofline_ms"] > rows[0]["prefill_roofline_ms"]
    itl = results["itl"]
    for label in ("baseline", "free_prompt", "det_prompt"):
        assert itl[label]["num_gaps"] > 0 and itl[label]["p50_ms"] > 0
    # the deterministic prompt is prefilled by ceil(40 / R = 16) canonical passes, the free one in one fast step
    assert itl["det_prompt"]["ttft_ms"] > 0 and itl["det_over_free"] > 0
    # --replot re-prints a saved run's table and runs nothing
    assert main(["--replot", str(out), "--device", "cuda"]) == 0
    assert "TTFT / roofline" in capsys.readouterr().out


def test_prefill_roofline_is_the_prompts_flops_at_the_gemm_rate():
    from llm42.bench.long_prompts import prefill_roofline_s

    model = build_model("tiny", device=CPU, dtype=torch.float32, max_positions=64)
    cfg, sizes = model.cfg, model_sizes(model.weights, model.cfg)
    flops = 2 * sizes["layer_matrix_params"] * 10 + 2 * sizes["head_params"] \
        + 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * 10 * 11 / 2
    assert prefill_roofline_s(model, 10, matmul_TFLOPs=2.0) == pytest.approx(flops / 2e12)


# -- the pieces ---------------------------------------------------------------------------------------

def test_clock_readings_never_synchronise_the_device(monkeypatch):
    """The engine overlaps host and device: only start/stop may drain it, never a per-step reading."""
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: calls.append("sync"))
    clock = Clock(torch.device("cuda"))
    clock.now(), clock.now()
    assert calls == []
    clock.start(), clock.stop()
    assert calls == ["sync", "sync"]


def test_itl_and_tpot_come_from_delivery_times():
    rec = RequestRecord(0, False, arrival_s=0.0, first_token_s=1.0, finish_s=4.0, num_tokens=7,
                        delivery_s=[1.0, 1.5, 4.0])
    assert rec.itl_s == [0.5, 2.5]
    assert rec.tpot_s == pytest.approx(0.5)
    summary = cdf([3.0, 1.0, 2.0])
    assert summary["values"][0] == 1.0 and summary["values"][-1] == 3.0 and summary["num_values"] == 3


def test_roofline_counts_prefill_flops_and_decode_bytes_by_hand():
    model = build_model("tiny", device=CPU, dtype=torch.float32, max_positions=64)
    cfg = model.cfg
    workload = fixed_shape(10, 5, 2, length_scale=1.0, vocab_size=cfg.vocab_size, sampled_share=0.0)
    sizes = model_sizes(model.weights, cfg)
    got = roofline(workload, model.weights, cfg, copy_GBps=1.0, matmul_TFLOPs=1.0, max_num_seqs=256)
    attention = 2 * 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * 10 * 11 / 2
    assert got["prefill_flops"] == 2 * sizes["layer_matrix_params"] * 20 + 2 * sizes["head_params"] * 2 + attention
    # 4 decode rows per request at positions 10..13, reading 11..14 positions; 4 steps (the longest output - 1)
    assert got["decode_min_steps"] == 4
    assert got["decode_bytes"] == 4 * sizes["weight_bytes_per_step"] + 2 * (11 + 12 + 13 + 14) * \
        sizes["kv_bytes_per_token"]
    assert got["bound_s"] == pytest.approx(got["prefill_s"] + got["decode_s"])
    assert got["output_tokens_per_s"] == pytest.approx(10 / got["bound_s"])
    # a step's GEMMs, then its K/V reads: tiny batches are weight-bound, so the weights' reads plus the K/V's
    kv_s = 2 * (11 + 12 + 13 + 14) * sizes["kv_bytes_per_token"] / 1e9
    assert got["decode_kv_s"] == pytest.approx(kv_s)
    weights_s = 4 * sizes["weight_bytes_per_step"] / 1e9
    assert got["serial_bound_s"] == pytest.approx(got["prefill_s"] + max(got["decode_compute_s"], weights_s) + kv_s)
    # equal here: these decode steps are weight-bound, so both bounds read weights then K/V; where the GEMMs are
    # longer than the weight reads, the serial bound adds the K/V reads to them
    assert got["serial_bound_s"] == pytest.approx(got["bound_s"])
    slow_gemm = roofline(workload, model.weights, cfg, copy_GBps=1.0, matmul_TFLOPs=1e-6, max_num_seqs=256)
    assert slow_gemm["decode_bound_by"] == "compute"  # GEMMs longer than every read: the K/V reads come on top
    assert slow_gemm["serial_bound_s"] == pytest.approx(slow_gemm["bound_s"] + kv_s)
    assert got["serial_output_tokens_per_s"] == pytest.approx(10 / got["serial_bound_s"])


def test_flip_rate_counts_compared_rows_and_sees_a_noisy_fast_path():
    model = build_model("tiny", device=CPU, dtype=torch.float32, max_positions=64)
    prompts = [r.prompt for r in sharegpt_like(6, length_scale=1 / 16, vocab_size=model.cfg.vocab_size).requests]
    clean = flip_rate(model.weights, model.cfg, prompts, num_steps=3, num_alone=2)
    assert clean["num_compared"] == 6 and clean["num_steps"] == 3
    assert clean["greedy"]["num_compared"] + clean["sampled"]["num_compared"] == 6
    # negative control: a fast path whose logits get fresh noise at every call flips most compared tokens
    noisy = flip_rate(model.weights, model.cfg, prompts, num_steps=3, num_alone=2,
                      policy=NoisyFastPolicy(scale=5.0, seed=1))
    assert noisy["num_flips"] >= 3


def test_first_mismatch_is_the_first_differing_position():
    assert first_mismatch([1, 2, 3], [1, 2, 4]) == 2
    assert first_mismatch([1, 2, 3], [1, 2, 3]) is None
    assert first_mismatch([5], [6]) == 0


class _WordTokenizer:
    """A stand-in tokenizer: one id per word (no chat template), so lengths are easy to check."""

    chat_template = None

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [3 + len(word) % 50 for word in text.split()]}


def test_chat_prompts_take_the_sharegpt_lengths_and_reach_the_input_length():
    base = sharegpt_like(8, length_scale=0.25, vocab_size=64, seed=3)
    chat = chat_like(8, tokenizer=_WordTokenizer(), length_scale=0.25, vocab_size=64, seed=3)
    assert [r.max_new_tokens for r in chat.requests] == [r.max_new_tokens for r in base.requests]
    assert [r.temperature for r in chat.requests] == [r.temperature for r in base.requests]
    for ours, theirs in zip(chat.requests, base.requests):
        assert len(ours.prompt) >= len(theirs.prompt)
    assert chat.requests == chat_like(8, tokenizer=_WordTokenizer(), length_scale=0.25, vocab_size=64, seed=3).requests


@pytest.mark.slow
def test_transformers_generate_comparison_runs_on_a_tiny_checkpoint(tmp_path):
    """The transformers side (a subprocess) and the llm42 side on the same prompts, on the CPU."""
    transformers = pytest.importorskip("transformers")
    from llm42.bench.serving import main

    config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                      eos_token_id=2, bos_token_id=1)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "ckpt")
    out = tmp_path / "s.json"
    assert main(["--device", "cpu", "--model", str(tmp_path / "ckpt"), "--budget-s", "120", "--num-requests", "4",
                 "--max-num-seqs", "4", "--modes", "nondet", "--online-modes", "", "--steady-batch", "2",
                 "--steady-steps", "2", "--hf-no-compile", "--out", str(out), "--no-plots"], repo=REPO) == 0
    entry = json.loads(out.read_text())["transformers"]
    assert entry["hf"]["output_tokens_per_s"] > 0 and entry["hf"]["new_tokens"] == 8
    assert entry["llm42"]["is_complete"] and entry["llm42_over_hf"] > 0


def test_serving_engine_takes_the_canonical_sms_and_the_scheduler_order_and_admission():
    """The issue's serving harness serves round 42's latency-first config (``--canonical-sms N``, round 43's
    ``--canonical-sms-max-rows``) and the budget order
    (``--order budget --admission budget``), every mode alike; the defaults stay every SM, the library's order of service and arrival admission."""
    from llm42.bench.serving import ServingConfig, _engine, parse_args

    args = parse_args(["--canonical-sms", "32", "--canonical-sms-max-rows", "16", "--order", "budget", "--admission",
                       "budget"])
    assert (args.canonical_sms, args.canonical_sms_max_rows, args.order, args.admission) == (32, 16, "budget",
                                                                                              "budget")
    plain = parse_args([])
    assert (plain.canonical_sms, plain.canonical_sms_max_rows, plain.order, plain.admission) == (
        None, None, "canonical_budget", "arrival")
    model = build_model("tiny", device=CPU, dtype=torch.float32, max_positions=64)
    workload = fixed_shape(8, 4, 2, length_scale=1.0, vocab_size=model.cfg.vocab_size, seed=0, sampled_share=0.0)
    config = ServingConfig(device="cpu", model="tiny", dtype=torch.float32, budget_s=10, window=4, group=2,
                           max_num_seqs=2, canonical_sms=32, canonical_sms_max_rows=16, scheduler_order="budget",
                           scheduler_admission="budget")
    for mode in ("nondet", "dvr@50"):
        gen, _ = _engine(model, config, workload).generator(mode_by_name(mode))
        try:
            assert (gen.config.canonical_sms, gen.config.canonical_sms_max_rows) == (32, 16)
            assert (gen.scheduler.order, gen.scheduler.admission) == ("budget", "budget")
        finally:
            gen.close()


def test_serving_runs_only_the_phases_asked_for(tmp_path):
    """``--phases steady``: the steady-decode figures (issue 10's first target, re-measured alone) and nothing else,
    exit 0; the serving fixture above is the control that runs every phase."""
    from llm42.bench.serving import main

    out = tmp_path / "steady.json"
    rc = main(["--device", "cpu", "--model", "tiny", "--budget-s", "30", "--steady-batch", "4", "--steady-steps",
               "3", "--phases", "steady", "--out", str(out), "--no-plots"], repo=REPO)
    results = json.loads(out.read_text())
    assert rc == 0 and results["errors"] == {} and results["meta"]["is_complete"]
    assert set(results["steady_decode"]) == {"overlap", "no_overlap"}
    assert all(s["is_complete"] for s in results["steady_decode"].values())
    assert results["offline"] is None and results["online"] is None
    assert results["transformers"] == {"skipped": "not among --phases"}


def test_the_phases_run_share_the_whole_budget_in_their_usual_proportions():
    from llm42.bench.serving import PHASE_SHARES, PHASES, phase_shares

    assert phase_shares(PHASE_SHARES, PHASES) == pytest.approx(PHASE_SHARES)  # all of them: as before
    assert phase_shares(PHASE_SHARES, ("steady",)) == {"steady": 1.0, "offline": 0.0, "transformers": 0.0,
                                                       "online": 0.0}
    both = phase_shares(PHASE_SHARES, ("offline", "online"))
    assert sum(both.values()) == pytest.approx(1.0) and both["steady"] == both["transformers"] == 0.0
    assert both["offline"] / both["online"] == pytest.approx(PHASE_SHARES["offline"] / PHASE_SHARES["online"])


def test_serving_phases_are_checked_naming_the_field():
    from llm42.bench.serving import ServingConfig

    for phases, match in (((), "phases"), (("steady", "warmup"), "phases"), (("online",), "online needs offline")):
        with pytest.raises(ValueError, match=match):
            ServingConfig(device="cpu", model="tiny", dtype=torch.float32, budget_s=10, phases=phases)


def test_kv_tokens_for_caps_the_store_at_its_share_of_free_memory_and_a_variant_sets_the_share(monkeypatch):
    """The benchmarks' K/V store: the whole of the ``max_num_seqs`` longest requests, capped on CUDA at
    ``free_fraction`` of the free memory (0.6 by default); dvr_ab's ``kv_free_fraction`` variant gets its own
    size through ``kv_tokens``. The device is faked (``mem_get_info`` reports 1 GiB): the cap is arithmetic."""
    from types import SimpleNamespace

    from llm42.bench.serving import KV_FREE_FRACTION, kv_tokens_for
    from llm42.bench.runner import WARMUP_KV_TOKENS

    from tests.helpers import load_device_script

    workload = sharegpt_like(40, length_scale=1.0, vocab_size=1000, seed=0)
    totals = sorted((len(r.prompt) + r.max_new_tokens for r in workload.requests), reverse=True)
    need = sum(totals[:16]) + WARMUP_KV_TOKENS
    cfg = SimpleNamespace(num_layers=2, kv_size=64)
    per_token = 2 * 2 * 64 * 2
    cpu = SimpleNamespace(cfg=cfg, weights=SimpleNamespace(device=torch.device("cpu"), dtype=torch.bfloat16))
    assert kv_tokens_for(cpu, workload, 16) == need == kv_tokens_for(cpu, workload, 16, free_fraction=0.1)
    cuda = SimpleNamespace(cfg=cfg, weights=SimpleNamespace(device=torch.device("cuda"), dtype=torch.bfloat16))
    free = need * per_token  # the whole set would fit the free memory: every share below 1 caps it
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 2 * free))
    default = kv_tokens_for(cuda, workload, 16)
    assert default == int(KV_FREE_FRACTION * free) // per_token < need
    assert default < kv_tokens_for(cuda, workload, 16, free_fraction=0.85) == int(0.85 * free) // per_token < need
    for bad in (0.0, 1.0, -0.5):
        with pytest.raises(ValueError, match="free_fraction"):
            kv_tokens_for(cuda, workload, 16, free_fraction=bad)

    dvr_ab = load_device_script("dvr_ab")
    monkeypatch.setattr(dvr_ab.dataclasses, "replace", lambda engine, **knobs: SimpleNamespace(**vars(engine), **knobs))
    base = SimpleNamespace(canonical_gemm="cublas", canonical_tile_m=64)
    got = dvr_ab.engine_variant(base, dvr_ab.VARIANTS["admit_budget_kv_0.85"], kv_tokens=lambda f: int(f * 1000))
    assert got.kv_cache_tokens == 850 and got.scheduler_admission == "budget"
    assert not hasattr(dvr_ab.engine_variant(base, dvr_ab.VARIANTS["admit_budget"], kv_tokens=lambda f: 1),
                       "kv_cache_tokens")  # other variants keep the base's store
    with pytest.raises(ValueError, match="kv_free_fraction"):
        dvr_ab.engine_variant(base, dvr_ab.VARIANTS["admit_budget_kv_0.85"])
    # kv_positions: that many positions, capped at what KV_POSITIONS_MAX_FRACTION of the free memory holds
    roomy = dvr_ab.engine_variant(base, dvr_ab.VARIANTS["admit_budget_kv_250k"], kv_tokens=lambda f: int(f * 10**6))
    assert roomy.kv_cache_tokens == 250_000 and not hasattr(roomy, "kv_positions")
    tight = dvr_ab.engine_variant(base, dvr_ab.VARIANTS["admit_budget_kv_250k"], kv_tokens=lambda f: int(f * 10**5))
    assert tight.kv_cache_tokens == int(dvr_ab.KV_POSITIONS_MAX_FRACTION * 10**5)
    with pytest.raises(ValueError, match="kv_positions"):
        dvr_ab.engine_variant(base, dvr_ab.VARIANTS["admit_budget_kv_250k"])
