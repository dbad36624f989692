"""Long prompts: TTFT against the prefill roofline (free and deterministic), and the free requests' ITL while
a long prompt is admitted (issue 12's items 3 and 5).

One H200 (the 8B shape with random weights):
    PYTHONPATH=src python3 benchmarks/long_prompts.py --device cuda --model 8b --budget-s 400

CPU smoke run (tiny random model, seconds):
    PYTHONPATH=src python3 benchmarks/long_prompts.py --device cpu --window 4 --group 4

``--help`` lists every option; ``llm42.bench.long_prompts`` describes what is measured.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))

from llm42.bench.long_prompts import main as _main  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    return _main(argv, repo=REPO)


if __name__ == "__main__":
    sys.exit(main())
