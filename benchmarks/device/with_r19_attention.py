"""Run a module (``python -m`` style) or a script with round 19's tiled attention kernels in place of this tree's.

    PYTHONPATH=src python3 benchmarks/device/with_r19_attention.py [--baseline PATH] -m llm42.bench.long_prompts ARGS
    PYTHONPATH=src python3 benchmarks/device/with_r19_attention.py [--baseline PATH] benchmarks/device/dvr_ab.py ARGS

``llm42.kernels``' tiled prefill, canonical and canonical-decode launches become those of ``--baseline`` (default
``benchmarks/device/baseline_r19/tiled_attention_r19.py``: ``git show 56037d0:src/llm42/kernels/tiled_attention.py``
written there before the call), so that one device call measures the same benchmark on both kernels, side by side.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks" / "device"))

from run_target import run_target  # noqa: E402


def main() -> None:
    argv = sys.argv[1:]
    baseline = REPO / "benchmarks" / "device" / "baseline_r19" / "tiled_attention_r19.py"
    if argv[:1] == ["--baseline"]:
        baseline, argv = Path(argv[1]), argv[2:]
    spec = importlib.util.spec_from_file_location("tiled_attention_r19", baseline)
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    from llm42 import kernels

    for name in ("tiled_prefill_attention", "tiled_canonical_attention", "tiled_canonical_decode_attention"):
        setattr(kernels, name, getattr(old, name))
    print(f"with_r19_attention: llm42.kernels' tiled launches from {baseline}", flush=True)
    run_target(argv, "with_r19_attention.py [--baseline PATH]")


if __name__ == "__main__":
    main()
