"""The serving-scale benchmark: steady decode, offline and online ShareGPT-like load, roofline, transformers.

One H200 (the 8B shape with random weights; SmolLM2 from a .gguf or HF directory):
    PYTHONPATH=src python3 benchmarks/serving.py --device cuda --model 8b --budget-s 400
    PYTHONPATH=src python3 benchmarks/serving.py --device cuda --model /root/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

CPU smoke run (tiny random model, seconds):
    PYTHONPATH=src python3 benchmarks/serving.py --device cpu --model tiny --budget-s 20

``--help`` lists every option; ``llm42.bench.serving`` and docs/benchmarks.md describe what is measured.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))

from llm42.bench.serving import main as _main  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    return _main(argv, repo=REPO)


if __name__ == "__main__":
    sys.exit(main())
