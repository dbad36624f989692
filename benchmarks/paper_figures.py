"""The LLM-42 paper's Fig. 6, 9 and 10 on a real model (SmolLM2), and on the 8B shape calibrated to its flip rate.

One H200:
    PYTHONPATH=src python3 benchmarks/paper_figures.py --device cuda \
        --model /root/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf --random-model 8b --budget-s 480

CPU smoke run (tiny random models in both roles, seconds):
    PYTHONPATH=src python3 benchmarks/paper_figures.py --device cpu --model tiny --random-model tiny --budget-s 30

``--help`` lists every option; ``llm42.bench.figures`` and docs/benchmarks.md describe what is measured.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))

from llm42.bench.figures import main as _main  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    return _main(argv, repo=REPO)


if __name__ == "__main__":
    sys.exit(main())
