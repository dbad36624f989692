"""``llm42.bench.metrics.free_gap_attribution``: free requests' inter-token gaps by what the steps they span did
(launched a canonical pass, delivered its commits, both, neither), for the online ITL target (round 33: free ITL
p99 at 2.1x nondet's in dvr@50 on an H100)."""

from __future__ import annotations

import pytest

from llm42.bench.metrics import (FAST_TOKEN_BINS, GAP_KINDS, PASS_WIDTHS, RUNNING, RequestRecord, RunResult,
                                 StepRecord, free_gap_attribution)
from tests.helpers import run_dvr_ab


def _run() -> RunResult:
    # five steps of 1 ms, the third 10 ms: it launched a pass; the fourth applied it (deterministic tokens)
    steps, t = [], 0.0
    for launched, applied, length, gc_ms in ((0, 0, 1, 0), (0, 0, 1, 0), (1, 0, 10, 0), (0, 2, 1, 0.5), (0, 0, 1, 0)):
        steps.append(StepRecord(t, t + length / 1e3, launched, applied, gc_ms / 1e3))
        t += length / 1e3
    ends = [s.end_s for s in steps]
    free = RequestRecord(0, False, 0.0, delivery_s=[ends[0], ends[1], ends[2], ends[4]])  # skips step 3 (index)
    other = RequestRecord(1, False, 0.0, delivery_s=[ends[1], ends[3]])
    det = RequestRecord(2, True, 0.0, delivery_s=[ends[3]])
    return RunResult("dvr@50", [free, other, det], t, None, {}, True, steps=steps)


def test_each_gap_takes_the_kind_of_the_steps_it_spans():
    got = free_gap_attribution(_run())
    assert got["num_gaps"] == 4 and got["unmatched_deliveries"] == 0
    shares = {k: g["share"] for k, g in got["gaps"].items()}
    # free: 0->1 neither (1 ms), 1->2 launch (10 ms), 2->4 apply (steps 3 and 4: 2 ms); other: 1->3 both (11 ms)
    assert shares == {"neither": 0.25, "launch": 0.25, "apply": 0.25, "launch_and_apply": 0.25}
    assert got["gaps"]["launch"]["p50_ms"] == pytest.approx(10.0)
    assert got["gaps"]["launch_and_apply"]["p99_ms"] == pytest.approx(11.0)
    assert got["gaps"]["apply"]["p50_ms"] == pytest.approx(2.0)
    assert got["slowest_1pct_share"] == {"neither": 0.0, "launch": 0.0, "apply": 0.0, "launch_and_apply": 1.0}
    assert {k: s["count"] for k, s in got["steps"].items()} == {"neither": 3, "launch": 1, "apply": 1,
                                                                 "launch_and_apply": 0}
    assert got["steps"]["launch"]["p50_ms"] == pytest.approx(10.0)
    # the collector ran in step 3 only: the gaps spanning it are free's 2->4 and other's 1->3 (the slowest)
    assert got["gc"] == {"steps": 1, "total_ms": 0.5, "max_step_ms": 0.5, "gap_share": 0.5, "slowest_1pct_share": 1.0}


def test_each_gap_is_classed_by_the_widest_pass_its_fast_steps_could_run_beside():
    # six 1 ms steps; step 1 launches a 256-row pass, step 4 a 2,048-row one (made 5 ms long)
    steps, t = [], 0.0
    for rows, length in ((0, 1), (256, 1), (0, 1), (0, 1), (2048, 5), (0, 1)):
        steps.append(StepRecord(t, t + length / 1e3, int(rows > 0), 0, canonical_rows=rows))
        t += length / 1e3
    ends = [s.end_s for s in steps]
    # gaps 0->1, 1->2 (steps 0-2: the 256-row pass), 2->3 (steps 1-3: it again), 3->4 and 4->5 (the wide one)
    free = RequestRecord(0, False, 0.0, delivery_s=ends)
    late = RequestRecord(1, False, 0.0, delivery_s=[ends[3], ends[5]])  # 3->5 spans the wide pass: the slowest
    got = free_gap_attribution(RunResult("dvr@50", [free, late], t, None, {}, True, steps=steps))["beside"]
    assert set(got["gaps"]) == set(PASS_WIDTHS)
    assert {k: g["share"] for k, g in got["gaps"].items()} == pytest.approx(
        {"no_pass": 0.0, "rows_le_256": 3 / 6, "rows_le_1024": 0.0, "rows_gt_1024": 3 / 6})
    # a gap's steps and the one before: free's 0->1 steps 0-1 (the narrow pass), 3->4 steps 2-4 (the wide one);
    # beside the wide pass: 5, 1 and 6 ms
    assert got["gaps"]["rows_gt_1024"]["p50_ms"] == pytest.approx(5.0)
    assert got["gaps"]["rows_le_256"]["p50_ms"] == pytest.approx(1.0)
    assert got["slowest_1pct_share"] == {"no_pass": 0.0, "rows_le_256": 0.0, "rows_le_1024": 0.0, "rows_gt_1024": 1.0}
    # negative control: the same run without pass rows puts every gap in "no_pass"
    bare = [s._replace(canonical_rows=0) for s in steps]
    got = free_gap_attribution(RunResult("dvr@50", [free, late], t, None, {}, True, steps=bare))["beside"]
    assert got["gaps"]["no_pass"]["share"] == 1.0 and got["slowest_1pct_share"]["no_pass"] == 1.0


def test_each_step_says_whether_it_applied_after_the_read_or_launched_before_it():
    """``phase_order``: from the order a step's phases first ran (``StepRecord.phases``): a step that applied a pass at
    its top and launched after the read counts in neither; one whose apply came after the read counts as
    ``apply_after_read``; one that launched before the read as ``launch_before_read``; an untimed step in neither."""
    top = {"admit": 1e-4, "apply": 5e-4, "schedule": 1e-4, "fast_launch": 4e-4, "fast_read": 1e-3, "launch": 1e-3}
    late = {"admit": 1e-4, "schedule": 1e-4, "fast_launch": 4e-4, "fast_read": 1e-3, "apply": 5e-4, "launch": 1e-3}
    early = {"admit": 1e-4, "apply": 5e-4, "schedule": 1e-4, "fast_launch": 4e-4, "launch": 1e-3, "fast_read": 1e-3}
    steps, t = [], 0.0
    for phases in (top, late, late, early, None):
        steps.append(StepRecord(t, t + 3e-3, 1, 1, phases=phases))
        t += 3e-3
    free = RequestRecord(0, False, 0.0, delivery_s=[s.end_s for s in steps])
    got = free_gap_attribution(RunResult("dvr@50", [free], t, None, {}, True, steps=steps))["steps"]
    assert got["launch_and_apply"]["count"] == 5
    assert got["launch_and_apply"]["phase_order"] == {"apply_after_read": 2, "launch_before_read": 1}
    assert got["neither"]["phase_order"] == {"apply_after_read": 0, "launch_before_read": 0}
    # the same phases in the other order (the control): the counts move with the order alone
    flipped = [s._replace(phases=late if s.phases is top else s.phases) for s in steps]
    got = free_gap_attribution(RunResult("dvr@50", [free], t, None, {}, True, steps=flipped))["steps"]
    assert got["launch_and_apply"]["phase_order"] == {"apply_after_read": 3, "launch_before_read": 1}


def test_a_delivery_at_no_step_is_counted_not_guessed():
    run = _run()
    run.records[0].delivery_s.append(99.0)
    got = free_gap_attribution(run)
    assert got["unmatched_deliveries"] == 1 and got["num_gaps"] == 4


def test_dvr_ab_online_attributes_every_free_gap_to_its_steps(tmp_path, monkeypatch):
    """End to end on the CPU: every free delivery is a step's end; nondet's gaps are all "neither"; dvr@50's steps
    launch the passes the run counts (a step launches one, or two where a pass chains behind another)."""
    got = run_dvr_ab(tmp_path / "ab.json", monkeypatch, "default", "--online-load", "0.5", "--online-requests", "8",
                     "--online-budget-s", "120")
    runs = got["online"]["runs"]["default"]
    nondet, dvr = runs["nondet"]["free_gaps"], runs["dvr@50"]["free_gaps"]
    for gaps in (nondet, dvr):
        assert gaps["unmatched_deliveries"] == 0 and gaps["num_gaps"] > 0
        assert sum(g["share"] or 0 for g in gaps["gaps"].values()) == pytest.approx(1.0)
    assert nondet["gaps"]["neither"]["share"] == 1.0
    launching = dvr["steps"]["launch"]["count"] + dvr["steps"]["launch_and_apply"]["count"]
    assert 0 < launching <= runs["dvr@50"]["canonical_passes"] <= 2 * launching
    assert set(dvr["gaps"]) == set(GAP_KINDS)
    # by the widest pass beside them: nondet's gaps beside none, some of dvr@50's beside its passes
    assert nondet["beside"]["gaps"]["no_pass"]["share"] == 1.0
    # round 44: by a pass running beside (none in flight on the CPU: a pass is applied in its own step), and the
    # fast tokens each step read: every free token came from a fast step
    assert nondet["running"]["gaps"]["none_running"]["share"] == 1.0
    assert dvr["running"]["gaps"]["running"]["share"] > 0
    for gaps in (nondet, dvr):
        assert gaps["fast_tokens"]["per_step_mean"] > 0 and gaps["fast_tokens"]["per_gap_mean"] > 0
        # round 45: the same classes at equal fast tokens partition the gaps
        shares = [b["share"] for bins in gaps["running_by_rows"].values() for b in bins.values()]
        assert sum(shares) == pytest.approx(1.0)
    assert not nondet["running_by_rows"]["running"]
    assert dvr["beside"]["gaps"]["no_pass"]["share"] < 1.0
    assert sum(g["share"] for g in dvr["beside"]["gaps"].values()) == pytest.approx(1.0)
    for gaps in (nondet, dvr):
        assert gaps["gc"]["total_ms"] >= 0 and 0 <= gaps["gc"]["gap_share"] <= 1
    # the engine phases, timed per step: launching steps spent time in "launch" (and its "stage"), others none
    # (a step's kind counts deliveries: on the CPU a pass is applied in the step that launches it, and a prompt
    # chunk's commit delivers nothing); the top-level phases add up to no more than the step
    for kind, step in dvr["steps"].items():
        phases = step["phases_mean_ms"]
        if not step["count"]:
            continue
        assert {"schedule", "fast_launch", "fast_read"} <= set(phases)
        assert ("launch" in phases and phases["launch"] >= phases["stage"] > 0) == kind.startswith("launch")
        top = sum(phases.get(n, 0.0) for n in ("admit", "apply", "schedule", "fast_launch", "fast_read", "launch"))
        assert top <= step["mean_ms"] + 1e-6
    assert "launch" not in nondet["steps"]["neither"]["phases_mean_ms"]
    # the default order: no launch before the read-back (that is pass_before_read's)
    assert all(step["phase_order"]["launch_before_read"] == 0 for step in dvr["steps"].values())


def test_the_tracker_times_the_collector_inside_a_step():
    """``_Tracker.collecting``: a collection forced inside ``step()`` is in that step's ``gc_s``, and nowhere once
    the block has ended (its callback is removed)."""
    import gc

    from llm42.bench.runner import Clock, _Tracker

    class Gen:
        stats = {"canonical_passes": 0}

        def __init__(self, collect: bool):
            self.collect = collect

        def step(self):
            if self.collect:
                gc.collect()
            return {}

    tracker = _Tracker(Gen(True), Clock(__import__("torch").device("cpu")))
    with tracker.collecting():
        tracker.step(0.0)
        tracker.gen = Gen(False)
        tracker.step(0.0)
    assert tracker.steps[0].gc_s > 0 and tracker.steps[1].gc_s == 0
    assert tracker._on_gc not in gc.callbacks
    gc.collect()
    assert tracker.gc_s == tracker.steps[0].gc_s


def test_each_gap_is_classed_by_whether_a_pass_could_run_beside_it_and_counts_its_fast_rows():
    """``running``: a pass launched two steps before a gap and still in flight (``pass_in_flight``) puts the gap in
    ``running``, which ``beside`` (passes launched nearby only) calls ``no_pass``; ``mean_fast_tokens`` is the fast
    tokens of each gap's delivering step."""
    # six 1 ms steps: step 0 launches a 256-row pass that runs through step 2; steps 3-5 see none
    steps, t = [], 0.0
    for rows, in_flight, tokens in ((256, False, 10), (0, True, 20), (0, True, 30), (0, False, 40), (0, False, 50),
                                    (0, False, 60)):
        steps.append(StepRecord(t, t + 1e-3, int(rows > 0), 0, canonical_rows=rows, fast_tokens=tokens,
                                pass_in_flight=in_flight))
        t += 1e-3
    free = RequestRecord(0, False, 0.0, delivery_s=[s.end_s for s in steps])
    got = free_gap_attribution(RunResult("dvr@50", [free], t, None, {}, True, steps=steps))
    # gaps 0->1 .. 4->5, each with the step before its first delivery: 0->1, 1->2, 2->3 (steps 1-3: in flight) and
    # 3->4 (steps 2-4) ran beside the pass; only 4->5 (steps 3-5) beside none
    assert set(got["running"]["gaps"]) == set(RUNNING)
    assert got["running"]["gaps"]["running"]["share"] == pytest.approx(4 / 5)
    assert got["running"]["gaps"]["none_running"]["mean_fast_tokens"] == 60
    assert got["running"]["gaps"]["running"]["mean_fast_tokens"] == pytest.approx((20 + 30 + 40 + 50) / 4)
    assert got["beside"]["gaps"]["no_pass"]["share"] == pytest.approx(3 / 5)  # 2->3, 3->4, 4->5: launched 2+ before
    # round 45: the same classes by the delivering step's fast tokens: 0->1 and 1->2 (20 and 30) beside the launch
    assert got["beside_by_rows"]["rows_le_256"] == {"le_32": {"share": pytest.approx(2 / 5), "p50_ms": 1.0,
                                                              "p99_ms": 1.0}}
    assert set(got["beside_by_rows"]["no_pass"]) == {"le_64"}  # 40, 50, 60
    assert got["fast_tokens"] == {"per_step_mean": 35.0, "per_gap_mean": 40.0}
    # negative control: the same steps without the in-flight marks leave only the launch's own neighbours
    bare = [s._replace(pass_in_flight=False) for s in steps]
    got = free_gap_attribution(RunResult("dvr@50", [free], t, None, {}, True, steps=bare))
    assert got["running"]["gaps"]["running"]["share"] == pytest.approx(2 / 5)


def _gaps_beside_and_not(beside_ms: float, none_ms: float, **kwargs) -> dict:
    """One free request delivered in every step of 19: the first nine run beside a pass in flight, carrying 100 fast
    tokens each and lasting ``beside_ms``; the last ten beside none, 100 and 50 tokens in turn, lasting ``none_ms``
    scaled by their tokens (0.5x for 50)."""
    steps, t = [], 0.0
    for in_flight, tokens in ((True, 100),) * 9 + ((False, 100), (False, 50)) * 5:
        ms = beside_ms if in_flight else none_ms * tokens / 100
        steps.append(StepRecord(t, t + ms * 1e-3, 0, 0, fast_tokens=tokens, pass_in_flight=in_flight))
        t += ms * 1e-3
    free = RequestRecord(0, False, 0.0, delivery_s=[s.end_s for s in steps])
    return free_gap_attribution(RunResult("dvr@50", [free], t, None, {}, True, steps=steps), **kwargs)


def test_gaps_at_equal_fast_tokens_compare_beside_a_pass_and_beside_none():
    """``running_by_rows``: binned by the delivering step's fast tokens, a gap beside a pass that takes what a gap
    beside none takes at the same rows shows the same p50 in that bin, even though the classes' overall p50s differ
    (the running class carries more rows); a pass that lengthens the gaps shows in the same bin."""
    got = _gaps_beside_and_not(beside_ms=2.0, none_ms=2.0)
    by_rows = got["running_by_rows"]
    assert set(by_rows) == set(RUNNING)
    # 18 gaps: 8 delivered in steps beside the pass, the two after them still near it (the step before a gap's first
    # delivery counts), 8 beside none
    assert set(by_rows["running"]) == set(by_rows["none_running"]) == {"le_64", "le_128"}
    assert by_rows["running"]["le_128"]["share"] == pytest.approx(9 / 18)
    assert by_rows["none_running"]["le_64"]["share"] == pytest.approx(4 / 18)
    assert sum(b["share"] for bins in by_rows.values() for b in bins.values()) == pytest.approx(1.0)
    # no pass launched near any gap (the passes in flight were launched before the run): all "no_pass" by width
    assert {k for k, bins in got["beside_by_rows"].items() if bins} == {"no_pass"}
    assert by_rows["running"]["le_128"]["p50_ms"] == pytest.approx(by_rows["none_running"]["le_128"]["p50_ms"])
    # the overall classes differ though: the rows, not the pass
    gaps = got["running"]["gaps"]
    assert gaps["running"]["p50_ms"] > gaps["none_running"]["p50_ms"]
    assert gaps["running"]["mean_fast_tokens"] > gaps["none_running"]["mean_fast_tokens"]
    # control: the pass beside makes each gap 1.5x as long at the same rows, and the bin shows it
    slow = _gaps_beside_and_not(beside_ms=3.0, none_ms=2.0)["running_by_rows"]
    assert slow["running"]["le_128"]["p50_ms"] == pytest.approx(1.5 * slow["none_running"]["le_128"]["p50_ms"])


def test_equal_rows_ratio_is_one_when_a_pass_only_brings_rows_and_shows_a_pass_that_lengthens_gaps():
    """``running_at_equal_rows``: the per-bin p50 ratio beside a pass over beside none, and its mean weighted by
    the running gaps: 1.0 where the pass only brings rows (the classes' overall p50s differ all the same), 1.5 in
    the bin where it makes each gap 1.5x as long; bins with too few gaps in a class are left out."""
    same = _gaps_beside_and_not(beside_ms=2.0, none_ms=2.0, min_bin_gaps=1)["running_at_equal_rows"]
    assert same["bins"] == {"le_64": 1.0, "le_128": 1.0} and same["weighted"] == 1.0
    assert same["running_share_compared"] == 1.0
    # control: 1.5x in the 100-token bin (9 running gaps); the one 50-token running gap is not in flight, 1.0
    slow = _gaps_beside_and_not(beside_ms=3.0, none_ms=2.0, min_bin_gaps=1)["running_at_equal_rows"]
    assert slow["bins"] == {"le_64": 1.0, "le_128": 1.5}
    assert slow["weighted"] == pytest.approx((9 * 1.5 + 1 * 1.0) / 10)
    # the default minimum (20 gaps a class) leaves this 18-gap run nothing to compare: no figure, not a 1.0
    none = _gaps_beside_and_not(beside_ms=3.0, none_ms=2.0)["running_at_equal_rows"]
    assert none["bins"] == {} and none["weighted"] is None and none["running_share_compared"] == 0.0
    with pytest.raises(ValueError, match="min_bin_gaps"):
        _gaps_beside_and_not(beside_ms=2.0, none_ms=2.0, min_bin_gaps=0)


def test_fast_token_bins_cover_every_count_once():
    from llm42.bench.metrics import _fast_token_bin
    assert [_fast_token_bin(n) for n in (0, 32, 33, 64, 96, 128, 129, 192, 193, 10_000)] == [
        "le_32", "le_32", "le_64", "le_64", "le_96", "le_128", "le_192", "le_192", "gt_192", "gt_192"]
