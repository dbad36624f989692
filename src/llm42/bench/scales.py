"""Scale presets: how many requests, how long, which phases — sized to a time budget.

``tiny`` is the CPU smoke run (a tiny model, under a minute on a 2-core
machine). ``gpu`` is sized for one H200 with the 8B-shape model to finish in
under 9 minutes; ``budget_s`` is a hard stop either way: a run that would pass
its phase's share of it is cut short and marked incomplete, later runs of the
phase are skipped and listed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from llm42.bench.workloads import PAPER_FIXED_SHAPES


@dataclass(frozen=True)
class Scale:
    name: str
    window: int  # T of every run but the sweep's
    group: int  # G of every run but the sweep's
    num_requests: int  # per workload
    length_scale: float  # multiplies every input/output length
    fixed_shapes: tuple[tuple[int, int], ...]  # (input, output) before scaling
    online_loads: tuple[float, ...]  # arrival rates as fractions of the measured offline nondet request rate
    online_modes: tuple[str, ...]
    online_num_requests: int  # the first this-many ShareGPT-like requests arrive online
    sweep_windows: tuple[int, ...]
    sweep_groups: tuple[int, ...]
    sweep_mode: str  # the mode each (T, G) point runs
    sweep_num_requests: int  # the sweep serves the first this-many ShareGPT-like requests
    no_batching_max_requests: int  # one-at-a-time runs serve only this many requests (deterministic ones first)
    bi_check_requests: int  # requests re-run alone through BatchInvariantPolicy to check batch invariance
    budget_s: float
    # shares of the budget for offline / online / sweep: each phase ends by its cumulative share, so an
    # overrunning phase cannot starve the later ones (time a phase leaves unused carries over)
    phase_shares: tuple[float, float, float] = (0.55, 0.25, 0.20)

    def __post_init__(self) -> None:
        counts = (self.num_requests, self.online_num_requests, self.sweep_num_requests,
                  self.no_batching_max_requests)
        if min(counts) < 1 or self.length_scale <= 0 or self.budget_s <= 0:
            raise ValueError(f"scale {self.name!r}: request counts, length_scale and budget_s must be positive")
        if self.window < 1 or self.group < 1:
            raise ValueError(f"scale {self.name!r}: window and group must be >= 1")
        if len(self.phase_shares) != 3 or min(self.phase_shares) < 0 or sum(self.phase_shares) <= 0:
            raise ValueError(f"scale {self.name!r}: phase_shares must be three non-negative numbers, not all 0")

    def with_overrides(self, **changes) -> "Scale":
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


_ONLINE_MODES = ("nondet", "dvr@10", "dvr@50", "dvr@100", "batch_invariant")
_WINDOWS = (16, 32, 64, 128)
_GROUPS = (1, 4, 8, 16)

SCALES: dict[str, Scale] = {
    "tiny": Scale(
        name="tiny", window=16, group=4, num_requests=8, length_scale=1 / 32, fixed_shapes=PAPER_FIXED_SHAPES,
        online_loads=(0.3, 0.6, 0.9), online_modes=_ONLINE_MODES, online_num_requests=8,
        sweep_windows=_WINDOWS, sweep_groups=_GROUPS, sweep_mode="dvr@100", sweep_num_requests=4,
        no_batching_max_requests=8, bi_check_requests=4, budget_s=45.0,
    ),
    "gpu": Scale(
        name="gpu", window=32, group=8, num_requests=48, length_scale=1 / 4, fixed_shapes=PAPER_FIXED_SHAPES,
        online_loads=(0.4, 0.7, 0.9), online_modes=_ONLINE_MODES, online_num_requests=32,
        sweep_windows=_WINDOWS, sweep_groups=_GROUPS, sweep_mode="dvr@100", sweep_num_requests=16,
        no_batching_max_requests=3, bi_check_requests=3, budget_s=470.0, phase_shares=(0.55, 0.28, 0.17),
    ),
}
