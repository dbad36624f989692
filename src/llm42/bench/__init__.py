"""Benchmarks: llm42's DVR against the peers' batch-invariant approach, on the same request sets.

    from llm42.bench import SCALES, SuiteConfig, run_suite
    results = run_suite(SuiteConfig(device="cpu", model="tiny", dtype=torch.float32, scale=SCALES["tiny"]))

``main`` is the command line (``benchmarks/run_all.py``, ``llm42 bench``); ``docs/benchmarks.md``
describes the method, workloads, modes and metrics. ``llm42.bench.serving`` (``benchmarks/serving.py``)
measures the engine at serving scale against the device's roofline and transformers' ``generate``;
``llm42.bench.figures`` (``benchmarks/paper_figures.py``) reproduces the paper's Fig. 6, 9 and 10 on a
real model and on the 8B shape calibrated to its flip rate (``llm42.bench.flips``).
"""

from llm42.bench.cli import main
from llm42.bench.metrics import RequestRecord, RunResult, percentile, summarize
from llm42.bench.models import BenchModel, build_model
from llm42.bench.modes import DVR_SHARES, Mode, all_modes, deterministic_order, mode_by_name
from llm42.bench.plots import plot_all
from llm42.bench.report import markdown
from llm42.bench.runner import Engine, batch_invariance_check, run_offline, run_online
from llm42.bench.scales import SCALES, Scale
from llm42.bench.suite import PHASES, SuiteConfig, run_suite
from llm42.bench.workloads import (
    PAPER_FIXED_SHAPES,
    SHAREGPT_INPUT,
    SHAREGPT_OUTPUT,
    BenchRequest,
    LogNormal,
    Workload,
    fixed_shape,
    poisson_arrivals,
    sharegpt_like,
)

__all__ = [
    "main", "RequestRecord", "RunResult", "percentile", "summarize", "BenchModel", "build_model", "DVR_SHARES", "Mode",
    "all_modes", "deterministic_order", "mode_by_name", "plot_all", "markdown", "Engine", "SuiteConfig",
    "batch_invariance_check", "run_offline", "run_online", "run_suite", "PHASES", "SCALES", "Scale",
    "PAPER_FIXED_SHAPES", "SHAREGPT_INPUT", "SHAREGPT_OUTPUT", "BenchRequest", "LogNormal", "Workload", "fixed_shape",
    "poisson_arrivals", "sharegpt_like",
]
