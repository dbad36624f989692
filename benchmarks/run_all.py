"""Run the whole benchmark comparison; writes benchmarks/results/<name>.json plus PNG plots.

CPU smoke run (tiny random model, under a minute):
    PYTHONPATH=src python3 benchmarks/run_all.py --device cpu --scale tiny

One H200, Llama-3.1-8B shapes with random weights (under 9 minutes):
    PYTHONPATH=src python3 benchmarks/run_all.py --device cuda --model 8b --scale gpu

``--help`` lists every option; docs/benchmarks.md describes what is measured.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))

from llm42.bench.cli import main as _main  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    return _main(argv, repo=REPO)


if __name__ == "__main__":
    sys.exit(main())
