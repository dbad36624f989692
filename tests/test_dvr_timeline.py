"""benchmarks/device/dvr_timeline.py: the served run's timeline of fast steps and canonical passes.

Its arithmetic on spans drawn by hand (covered time, fast steps beside a pass, the tail after the last free request),
then a CPU run of the script on the tiny model: every timed step recorded once, every fast step and pass with a span
inside the run, passes only where requests are deterministic, and the hooks gone afterwards.
"""

from __future__ import annotations

import json

import pytest

from tests.helpers import load_device_script


@pytest.fixture(scope="module")
def timeline_module():
    return load_device_script("dvr_timeline")


def test_covered_time_counts_overlapping_spans_once(timeline_module):
    union = timeline_module._union_ms
    assert union([(0, 10), (5, 15), (20, 30)], 0, 40) == 25
    assert union([(0, 10), (5, 15)], 8, 12) == 4
    assert union([], 0, 10) == 0


def test_the_summary_splits_fast_steps_by_a_pass_beside_them_and_measures_the_tail(timeline_module):
    steps = [{"step": i, "host_start_ms": 10.0 * i, "host_end_ms": 10.0 * i + 9, "running_free": 1 if i < 2 else 0,
              "running_det": 1} for i in range(4)]
    fast = [{"step": i, "start_ms": 10.0 * i, "end_ms": 10.0 * i + 4 + 2 * (i == 1), "rows": 2} for i in range(4)]
    passes = [{"step": 1, "start_ms": 12.0, "end_ms": 20.0, "rows": 256, "priority": -1}]
    s = timeline_module.summarize(steps, fast, passes, free_last_finish_s=0.02)
    assert s["fast_steps_beside_a_pass"] == 1 and s["fast_ms_p50_beside_a_pass"] == 6.0
    assert s["fast_ms_p50_alone"] == 4.0
    assert s["fast_rows_p50_alone"] == s["fast_rows_p50_beside_a_pass"] == 2
    assert s["fast_us_per_row_p50_alone"] == 2000.0 and s["fast_us_per_row_p50_beside_a_pass"] == 3000.0
    assert s["pass_ms_p50_by_rows"] == {"256": 8.0} and s["passes_at_raised_priority"] == 1
    assert s["run_ms"] == 39.0
    assert s["busy"]["either"] == pytest.approx((4 + 10 + 4 + 4) / 39.0, abs=1e-4)  # 10-16 and 12-20: 10-20
    assert s["tail"]["start_ms"] == 20.0 and s["tail"]["either"] == pytest.approx(8 / 19.0, abs=1e-4)
    assert [b["running_free"] for b in s["bins"]] == [0]  # one 100 ms bin: the mix at its end
    assert s["fast_ms_p50_by_rows"] == {"<=32": {"alone_ms": 4.0, "beside_ms": 6.0, "num_alone": 3, "num_beside": 1,
                                                 "beside_over_alone": 1.5}}


def test_fast_steps_are_compared_with_a_pass_beside_them_at_the_same_rows(timeline_module):
    """By hand: small steps alone, big steps beside a pass (the medians over all steps would call the steps beside a
    pass 3x slower; at the same rows they are 1.25x); a class with one side only has no ratio; rows past the last
    bound are their own class."""
    fast = ([{"start_ms": 10.0 * i, "end_ms": 10.0 * i + 2, "rows": 40} for i in range(3)]
            + [{"start_ms": 100.0 + 10 * i, "end_ms": 100.0 + 10 * i + 5, "rows": 100} for i in range(2)]
            + [{"start_ms": 200.0, "end_ms": 204.0, "rows": 100}]
            + [{"start_ms": 300.0, "end_ms": 303.0, "rows": 600}])
    is_beside = [False, False, False, True, True, False, True]
    got = timeline_module._by_row_class(fast, is_beside)
    assert list(got) == ["<=64", "<=128", ">512"]
    assert got["<=64"] == {"alone_ms": 2.0, "beside_ms": None, "num_alone": 3, "num_beside": 0,
                           "beside_over_alone": None}
    assert got["<=128"] == {"alone_ms": 4.0, "beside_ms": 5.0, "num_alone": 1, "num_beside": 2,
                            "beside_over_alone": 1.25}
    assert got[">512"]["num_beside"] == 1 and got[">512"]["beside_over_alone"] is None


def test_a_cpu_run_records_every_step_and_span_and_restores_the_hooks(timeline_module, tmp_path):
    from llm42.bench import runner as runner_module
    from llm42.engine.fast_step import FastStep
    from llm42.verify.canonical_pass import CanonicalPass

    originals = (runner_module._Tracker.step, FastStep.launch, CanonicalPass._run_with_details)
    out = timeline_module.main(["--model", "tiny", "--out", str(tmp_path / "t.json"), "--num-requests", "6",
                                "--max-num-seqs", "16", "--max-fast-tokens", "64", "--budget-s", "400",
                                "--warmup-requests", "2", "--modes", "nondet,dvr@50", "--keep-spans"])
    assert (runner_module._Tracker.step, FastStep.launch, CanonicalPass._run_with_details) == originals
    assert json.loads((tmp_path / "t.json").read_text())["runs"].keys() == out["runs"].keys()
    for name, run in out["runs"].items():
        assert run["is_complete"], name
        steps, fast, passes = run["steps"], run["fast"], run["passes"]
        assert [s["step"] for s in steps] == list(range(len(steps)))  # every timed step once, warm-up left out
        assert fast and all(0 <= f["step"] < len(steps) and f["start_ms"] <= f["end_ms"] for f in fast)
        assert all(0 <= p["start_ms"] <= p["end_ms"] <= run["summary"]["run_ms"] for p in passes)
        assert 0.0 < run["summary"]["busy"]["either"] <= 1.0
        assert run["summary"]["num_steps"] == len(steps)
        assert run["notes"] == []  # the run went as planned (a failed graph capture would say so here)
    assert not out["runs"]["default nondet"]["passes"]  # no deterministic request, no pass
    assert out["runs"]["default dvr@50"]["passes"]
    assert "tail" in out["runs"]["default dvr@50"]["summary"]


def _req(rid, *, det=True, prefilled=True, verifying=False, speculable=3, draftable=0):
    from types import SimpleNamespace

    return SimpleNamespace(rid=rid, is_deterministic=det, num_prefilled=5 if prefilled else 2, num_prompt_tokens=5,
                           is_verifying=verifying, num_speculable=lambda window: speculable,
                           num_draftable_ahead=lambda window: draftable)


def test_det_progress_puts_each_deterministic_request_in_one_kind_per_sampled_step(timeline_module):
    """By hand: a window draft, drafts ahead of a due window and of one in a pass, idle in a pass, idle due (one of
    them could have drafted: no row left), and neither; free requests and prompts are not counted; the tail is the
    steps with no free request running; per token, every sampled step stands for ``every`` steps."""
    from types import SimpleNamespace

    det = timeline_module.DetProgress(every=2)
    running = {r.rid: r for r in (
        _req(1), _req(2, speculable=0), _req(3, verifying=True), _req(4, verifying=True, speculable=0),
        _req(5, speculable=0, draftable=4), _req(6, speculable=3), _req(7, det=False), _req(8, prefilled=False))}
    pool = SimpleNamespace(window=4, running=running)
    det.record(pool, SimpleNamespace(fast_decode=(1, 2, 3, 7)))
    assert det.totals == {"window": 1, "ahead": 2, "idle_in_pass": 1, "idle_due": 1, "idle_other": 1}
    assert det.idle_could_draft == 1 and sum(det.in_tail.values()) == 0
    del running[7]
    det.record(pool, SimpleNamespace(fast_decode=()))
    assert sum(det.in_tail.values()) == 6 and det.in_tail["idle_other"] == 2
    summary = det.summary({1: 3, 2: 3, 3: 0, 4: 0, 5: 0, 6: 0}, last=[1])
    assert summary["request_steps"] == 12 * 2 and summary["steps_per_token"] == round(24 / 6, 3)
    assert summary["shares"]["window"] == round(1 / 12, 4) and sum(summary["shares"].values()) == pytest.approx(1)
    assert summary["last_finishers"] == [{"rid": 1, "tokens": 3, "steps_per_token": round(2 * 2 / 3, 3),
                                          "shares": {"window": 0.5, "ahead": 0.0, "idle_in_pass": 0.0,
                                                     "idle_due": 0.0, "idle_other": 0.5}}]


def test_a_cpu_run_reports_where_deterministic_steps_go(timeline_module, tmp_path):
    out = timeline_module.main(["--model", "tiny", "--out", str(tmp_path / "t.json"), "--num-requests", "8",
                                "--max-num-seqs", "16", "--max-fast-tokens", "64", "--budget-s", "400",
                                "--warmup-requests", "0", "--modes", "nondet,dvr@50", "--det-progress", "1"])
    assert "det_progress" not in out["runs"]["default nondet"]
    progress = out["runs"]["default dvr@50"]["det_progress"]
    assert progress["sampled_steps"] == out["runs"]["default dvr@50"]["summary"]["num_steps"]
    # each share is rounded to 4 decimals: their sum is 1 to within their roundings
    assert sum(progress["shares"].values()) == pytest.approx(1, abs=5e-4) and progress["shares"]["window"] > 0.5
    assert 0.9 <= progress["steps_per_token"] <= 1.5  # about one step per token where passes apply at once
    assert progress["last_finishers"] and all("index" in f for f in progress["last_finishers"])


def test_an_online_cpu_run_serves_the_arrivals_with_every_span(timeline_module, tmp_path):
    """``--online-load``: the capacity from an untraced offline nondet run, then each mode served online to the same
    Poisson arrivals with the hooks; the rows split of the summary is there, and the hooks are restored."""
    from llm42.bench import runner as runner_module

    original = runner_module._Tracker.step
    out = timeline_module.main(["--model", "tiny", "--out", str(tmp_path / "t.json"), "--num-requests", "8",
                                "--max-num-seqs", "16", "--max-fast-tokens", "64", "--budget-s", "400",
                                "--warmup-requests", "0", "--modes", "nondet,dvr@50", "--online-load", "0.5",
                                "--online-requests", "6", "--keep-spans"])
    assert runner_module._Tracker.step is original
    assert out["online"]["num_requests"] == 6 and out["online"]["rate_rps"] == pytest.approx(
        0.5 * out["online"]["capacity_rps"])
    for name, run in out["runs"].items():
        assert run["is_complete"], name
        s = run["summary"]
        assert s["num_steps"] == len(run["steps"]) > 0
        assert s["fast_rows_p50_alone"] is not None and s["fast_us_per_row_p50_alone"] > 0
    assert not out["runs"]["default nondet"]["passes"] and out["runs"]["default dvr@50"]["passes"]


def test_the_summary_counts_a_sliced_pass_once_and_times_its_slices(timeline_module):
    """``canonical_slices``: a sliced pass's earlier slices are spans of their own (``slice``, not ``final``): the
    fast steps beside them are beside a pass, the pass counts once, its slices are timed apart from whole passes."""
    steps = [{"step": i, "host_start_ms": 10.0 * i, "host_end_ms": 10.0 * i + 9, "running_free": 1,
              "running_det": 1} for i in range(3)]
    fast = [{"step": i, "start_ms": 10.0 * i, "end_ms": 10.0 * i + 4, "rows": 4} for i in range(3)]
    passes = [{"step": 0, "start_ms": 1.0, "end_ms": 3.0, "rows": 256, "priority": 0, "slice": 0, "final": False},
              {"step": 1, "start_ms": 11.0, "end_ms": 14.0, "rows": 256, "priority": 0, "slice": 1, "final": True}]
    s = timeline_module.summarize(steps, fast, passes)
    assert s["num_passes"] == 1 and s["fast_steps_beside_a_pass"] == 2
    assert s["slice_ms_p50"] == {"0": 2.0, "1": 3.0} and s["pass_ms_p50_by_rows"] == {}


def _live_generators_at_each_creation(timeline_module, tmp_path, monkeypatch, *, hold_first: bool) -> list[int]:
    """main() on the tiny model, two variants served online; when each generator is made, how many made before it
    are still alive. The end of each run collects as it does on CUDA (``runner._release``; on the CPU it leaves the
    generator's reference cycles to the collector's own schedule); no collection here: cyclic garbage counts as
    alive, as it holds device memory on a GPU. ``hold_first``: the watch itself keeps the first one (the control)."""
    import gc
    import weakref

    from llm42.bench import runner as runner_module

    made: list[weakref.ref] = []
    held: list = []
    alive_at_creation: list[int] = []
    original = runner_module.Engine.generator

    def watched(self, *args, **kwargs):
        alive_at_creation.append(sum(ref() is not None for ref in made))
        gen, notes = original(self, *args, **kwargs)
        made.append(weakref.ref(gen))
        if hold_first and not held:
            held.append(gen)
        return gen, notes

    monkeypatch.setattr(runner_module.Engine, "generator", watched)
    monkeypatch.setattr(runner_module, "_release", lambda device: gc.collect())
    timeline_module.main(["--model", "tiny", "--out", str(tmp_path / "t.json"), "--num-requests", "6",
                          "--max-num-seqs", "16", "--max-fast-tokens", "64", "--budget-s", "400",
                          "--warmup-requests", "0", "--variants", "default,pass_before_read", "--modes", "dvr@50",
                          "--online-load", "0.5", "--online-requests", "4"])
    return alive_at_creation


def test_no_run_keeps_its_generator_alive_into_the_next(timeline_module, tmp_path, monkeypatch):
    """Each run builds a fresh generator (its K/V cache, its graphs' pools) and frees the one before at its end
    (``runner._release``): the timeline must not hold it then. Round 38 held the run's tracker, so its generator: on
    an H100 the second variant's decode graphs ran out of memory and that run went eagerly. When each generator is
    made, none before it may be alive; the control holds the first one, which the watch must see."""
    assert _live_generators_at_each_creation(timeline_module, tmp_path, monkeypatch, hold_first=False) == [0, 0, 0]
    assert _live_generators_at_each_creation(timeline_module, tmp_path, monkeypatch, hold_first=True) == [0, 1, 1]
