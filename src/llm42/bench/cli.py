"""The benchmark command line: ``benchmarks/run_all.py`` and ``llm42 bench`` both run ``main``.

Writes ``<out>/<name>.json`` (every number, plus device, model shape, T, G and
git commit) and three PNG plots, and prints the tables as Markdown.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import torch

from llm42.bench.models import MODEL_NAMES
from llm42.bench.plots import plot_all
from llm42.bench.report import markdown
from llm42.bench.scales import SCALES
from llm42.bench.suite import PHASES, SuiteConfig, run_suite

USAGE = """examples:
  CPU smoke run (tiny random model, under a minute):
    PYTHONPATH=src python3 benchmarks/run_all.py --device cpu --scale tiny
  one H200, Llama-3.1-8B shapes with random weights (under 9 minutes):
    PYTHONPATH=src python3 benchmarks/run_all.py --device cuda --model 8b --scale gpu
  redraw the plots of a saved run (e.g. where the GPU host lacks matplotlib):
    PYTHONPATH=src python3 benchmarks/run_all.py --replot benchmarks/results/cuda_8b_gpu.json
"""

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_args(argv: list[str] | None, repo: Path) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Benchmark llm42's DVR against no "
                                     "determinism, batch-invariant kernels and no batching (docs/benchmarks.md).",
                                     epilog=USAGE, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--model", default=None,
                        help=f"one of {MODEL_NAMES} or a checkpoint directory (default: tiny on cpu, 8b on cuda)")
    parser.add_argument("--scale", choices=sorted(SCALES), default=None,
                        help="preset (default: tiny on cpu, gpu on cuda)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                        help="default: float32 on cpu, bfloat16 on cuda")
    parser.add_argument("--window", type=int, default=None,
                        help="T, tokens per request per canonical pass (default: the scale's)")
    parser.add_argument("--group", type=int, default=None, help="G, requests per canonical pass (default: the scale's)")
    parser.add_argument("--num-requests", type=int, default=None, help="override the scale's requests per workload")
    parser.add_argument("--length-scale", type=float, default=None, help="override the scale's length factor")
    parser.add_argument("--budget-s", type=float, default=None, help="override the scale's time budget (seconds)")
    parser.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated subset of {PHASES}")
    parser.add_argument("--lm-head-std", type=float, default=None,
                        help="std of a random model's lm_head (default: 0.2 for 8b, as the other weights for tiny)")
    parser.add_argument("--no-cuda-graphs", action="store_true", help="run every step eagerly on CUDA")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU intra-op threads (default 1: tiny ops on a shared machine mostly spin otherwise)")
    parser.add_argument("--name", default=None,
                        help="results file stem (default: cpu_smoke for the plain tiny CPU run, else "
                             "<device>_<model>_<scale>)")
    parser.add_argument("--out", type=Path, default=repo / "benchmarks" / "results")
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--replot", type=Path, default=None, metavar="RESULTS_JSON",
                        help="only redraw the plots (and print the tables) of a saved results file")
    return parser.parse_args(argv)


def write_plots(results: dict, out: Path, name: str) -> list[Path]:
    if importlib.util.find_spec("matplotlib") is None:
        print("run_all: matplotlib is not installed, no plots (redraw later with --replot)", file=sys.stderr)
        return []
    return plot_all(results, out, name)


def replot(path: Path) -> int:
    """Redraw a saved run's plots and print its tables; 1 (with the reason) if it draws no plot at all."""
    results = json.loads(path.read_text())
    print(markdown(results))
    if importlib.util.find_spec("matplotlib") is None:
        print(f"run_all: --replot {path}: matplotlib is not installed, so nothing was drawn "
              "(pip install matplotlib)", file=sys.stderr)
        return 1
    written = plot_all(results, path.parent, path.stem)
    if not written:
        print(f"run_all: --replot {path}: the file holds no offline, sweep or online results to plot, "
              "so nothing was drawn", file=sys.stderr)
        return 1
    for plot in written:
        print(f"wrote {plot}")
    return 0


def main(argv: list[str] | None = None, *, repo: Path | None = None) -> int:
    """Run the suite as the arguments say; 0 on success, 1 if a run failed, 2 if nothing could run.

    ``repo``: the checkout whose git commit is recorded and whose
    ``benchmarks/results`` is the default output (the working directory if None).
    """
    repo = Path.cwd() if repo is None else repo
    args = parse_args(argv, repo)
    if args.replot is not None:
        return replot(args.replot)
    is_cuda = args.device == "cuda"
    model = args.model or ("8b" if is_cuda else "tiny")
    scale_name = args.scale or ("gpu" if is_cuda else "tiny")
    dtype = DTYPES[args.dtype or ("bfloat16" if is_cuda else "float32")]
    phases = tuple(p.strip() for p in args.phases.split(",") if p.strip())
    if set(phases) - set(PHASES):
        raise SystemExit(f"--phases: unknown {sorted(set(phases) - set(PHASES))}; choose from {PHASES}")
    if not is_cuda:
        torch.set_num_threads(args.threads)
    try:
        scale = SCALES[scale_name].with_overrides(
            window=args.window, group=args.group, num_requests=args.num_requests, length_scale=args.length_scale,
            budget_s=args.budget_s,
        )
        is_smoke = not is_cuda and model == "tiny" and scale == SCALES["tiny"] and phases == PHASES
        name = args.name or ("cpu_smoke" if is_smoke else f"{args.device}_{Path(model).name}_{scale_name}")
        config = SuiteConfig(device=args.device, model=model, dtype=dtype, scale=scale, seed=args.seed,
                             lm_head_std=args.lm_head_std, phases=phases, use_cuda_graphs=not args.no_cuda_graphs)
        results = run_suite(config, progress=not args.no_progress, repo=repo)
    except (RuntimeError, ValueError) as exc:
        print(f"run_all: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    json_path = args.out / f"{name}.json"
    json_path.write_text(json.dumps(results, indent=1) + "\n")
    written = [json_path]
    if not args.no_plots:
        written += write_plots(results, args.out, name)
    print(markdown(results))
    print()
    for path in written:
        print(f"wrote {path}")
    if results["errors"]:
        print(f"run_all: {len(results['errors'])} run(s) failed: {sorted(results['errors'])}", file=sys.stderr)
        return 1
    return 0


