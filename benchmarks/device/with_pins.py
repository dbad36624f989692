"""Run a module or a script with extra tile pins for the batch-invariant Triton matmul (a sweep's, not yet the tree's).

    PYTHONPATH=src python3 benchmarks/device/with_pins.py PINS.json benchmarks/device/dvr_ab.py ARGS
    PYTHONPATH=src python3 benchmarks/device/with_pins.py PINS.json -m llm42.bench.long_prompts ARGS

PINS.json maps ``"N,K"`` to a tile config (``gemm_graph_sweep.py --pins-out``); each is put into
``llm42.kernels.batch_invariant_matmul._SHAPE_CONFIGS`` for bf16 before the target runs, so that one device call
measures a sweep's pins before they are committed. ``FixedShapePolicy(gemm="triton")`` passes then run them (other
committed bits than the tree's Triton config where the pins change them).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "benchmarks" / "device"))

from run_target import run_target  # noqa: E402


def main() -> None:
    if len(sys.argv) < 3:
        raise SystemExit("usage: with_pins.py PINS.json (-m MODULE | SCRIPT.py) [ARGS...]")
    pins = json.loads(Path(sys.argv[1]).read_text())
    from llm42.kernels import batch_invariant_matmul as bim

    for key, config in pins.items():
        n, k = (int(v) for v in key.split(","))
        bim._SHAPE_CONFIGS[(torch.bfloat16, n, k)] = dict(config)
    print(f"with_pins: {len(pins)} pins from {sys.argv[1]}: {sorted(pins)}", flush=True)
    run_target(sys.argv[2:], "with_pins.py PINS.json")


if __name__ == "__main__":
    main()
