"""Run a module or script with the canonical pass's round-21 speed-ups undone (the same bits either way).

    PYTHONPATH=src python3 benchmarks/device/with_round20_canonical.py [--only pins|head] \
        -m llm42.bench.long_prompts ARGS

- pins: the canonical Triton GEMM on round 18's schedules for the 8B shape (round 21 pinned other tiles, a flattened
  tile / K pipeline and a TMA-store epilogue, which give the same bits: gemm_schedule.py);
- head: no result sizes below R (``pass_shapes.SMALLEST_RESULTS`` past any R), so every R-row pass runs its output
  head and sampler on all its rows, as round 20's did (round 21 runs them on the wanted rows where the GEMM rows are
  their own at any M).

Both by default; ``--only`` keeps one. One device call then measures a benchmark on both trees, side by side.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks" / "device"))
sys.path.insert(0, str(REPO / "src"))

from gemm_schedule import ROUND18  # noqa: E402
from run_target import run_target  # noqa: E402


def main() -> None:
    from llm42.kernels import batch_invariant_matmul as bim
    from llm42.verify import pass_shapes

    argv = sys.argv[1:]
    undo = {"pins", "head"}
    if argv[:1] == ["--only"]:
        undo, argv = {argv[1]}, argv[2:]
    if "pins" in undo:
        for (n, k), config in ROUND18.items():
            bim._SHAPE_CONFIGS[(torch.bfloat16, n, k)] = config
    if "head" in undo:
        pass_shapes.SMALLEST_RESULTS = 1 << 30
    print(f"with_round20_canonical: undone {sorted(undo)}", flush=True)
    run_target(argv, "with_round20_canonical.py [--only pins|head]")


if __name__ == "__main__":
    main()
