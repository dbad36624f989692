"""What the budgeted benchmark scripts (``serving.py``, ``paper_figures.py``) share.

The options every run takes, the per-device defaults (CPU defaults keep a smoke
run to seconds), a run's results kept on disk after every step (``Run``), the
``--replot`` path, SIGTERM from ``timeout`` turned into a clean stop, and the exit.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import importlib.util
import json
import signal
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch

from llm42.bench.devicetime import Budget, write_json
from llm42.bench.hostprobe import host_probe
from llm42.bench.suite import device_info, git_info
from llm42.engine.config import CANONICAL_TILE_HEIGHTS
from llm42.policies.fast import DECODE_KERNELS
from llm42.policies.fixed_shape import ATTENTION_KERNELS, GEMMS

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def add_common_args(p: argparse.ArgumentParser, *, out_help: str, budget_s: float) -> None:
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--budget-s", type=float, default=budget_s,
                   help=f"wall-clock budget for the whole run (default {budget_s:g})")
    p.add_argument("--window", type=int, default=32, help="T, tokens per request per canonical pass")
    p.add_argument("--group", type=int, default=8, help="G, requests per canonical pass")
    p.add_argument("--no-cuda-graphs", action="store_true")
    p.add_argument("--canonical-attention", choices=ATTENTION_KERNELS, default="tiled",
                   help="the canonical pass's attention kernel, FixedShapePolicy(attention_kernel=...): "
                   "part of the canonical config (the batch_invariant baseline takes the same one)")
    p.add_argument("--canonical-gemm", choices=GEMMS, default="cublas",
                   help="the canonical pass's GEMM on CUDA, FixedShapePolicy(gemm=...): part of the canonical "
                   "config; 'triton' runs a wide pass's GEMMs once over all its rows (the batch-invariant matmul)")
    p.add_argument("--canonical-tile-m", type=int, choices=CANONICAL_TILE_HEIGHTS, default=64,
                   help="the tiled canonical attention's tile height in M-rows, FixedShapePolicy(tile_m=...): part of "
                   "the canonical config (the fast path's canonical decode launches and the batch_invariant baseline "
                   "take the same)")
    p.add_argument("--fast-decode-kernel", choices=DECODE_KERNELS, default="split",
                   help="FastPolicy(decode_kernel=...): 'canonical' gives large decode batches the canonical tiled "
                   "kernel's attention bits, 'deterministic' deterministic requests' decode rows the canonical "
                   "attention's bits (the chunked kernel's with --canonical-attention chunked; serving and "
                   "long-prompt benchmarks)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="CPU intra-op threads")
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="where a .gguf is converted once to a HF directory (default: a temp dir)")
    p.add_argument("--out", type=Path, default=None, help=out_help)
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--replot", type=Path, default=None, metavar="RESULTS_JSON",
                   help="only redraw the plots of a saved run")


def names(text: str) -> tuple[str, ...]:
    """A comma-separated option as a tuple ('' is empty)."""
    return tuple(x.strip() for x in text.split(",") if x.strip())


class OnDevice:
    """``pick(value, on_cuda, on_cpu)``: an option's value, else its default for the device."""

    def __init__(self, args: argparse.Namespace):
        self.is_cuda = args.device == "cuda"
        self.dtype = DTYPES[args.dtype or ("bfloat16" if self.is_cuda else "float32")]
        if not self.is_cuda:
            torch.set_num_threads(args.threads)

    def __call__(self, value, on_cuda, on_cpu):
        if value is not None:
            return value
        return on_cuda if self.is_cuda else on_cpu


def write_plots(results: dict, json_path: Path, plotter: str) -> list[Path]:
    """``llm42.bench.plots.<plotter>`` next to the JSON; none (with a note) where matplotlib is missing."""
    if importlib.util.find_spec("matplotlib") is None:
        log("matplotlib is not installed: no plots (redraw later with --replot)")
        return []
    plot = getattr(importlib.import_module("llm42.bench.plots"), plotter)
    return plot(results, json_path.parent, json_path.stem)


def replot(path: Path, plotter: str) -> int:
    for written in write_plots(json.loads(path.read_text()), path, plotter):
        print(f"wrote {written}")
    return 0


def finish(results: dict, out: Path, *, no_plots: bool, plotter: str, report: str) -> int:
    """Plots, the report, the files written; 0 if every phase ran, 1 if a run failed or the budget cut it."""
    written = [out] + ([] if no_plots else write_plots(results, out, plotter))
    print(report)
    for path in written:
        print(f"wrote {path}")
    return 0 if results["meta"]["is_complete"] and not results["errors"] else 1


def jsonable(value):
    """Tuples become lists and NaN None, so the results equal their own JSON round trip."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and value != value:
        return None
    return value


def run_meta(config, device: torch.device, repo: Path) -> dict:
    return {
        "started_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "config": {k: (str(v) if isinstance(v, torch.dtype) else v) for k, v in vars(config).items()},
        "device": device_info(device),
        "host_probe": host_probe(),  # the host's speed, to compare runs across machines
        "git": git_info(repo),
        "is_complete": False,
    }


@dataclass
class Run:
    """One benchmark run's config, budget and results, rewritten to ``out`` after every step."""

    config: object
    out: Path
    budget: Budget
    results: dict
    errors: dict = field(default_factory=dict)

    def save(self) -> None:
        self.results["meta"]["elapsed_s"] = self.budget.elapsed_s()
        self.results["errors"] = self.errors
        write_json(self.out, jsonable(self.results))

    def guarded(self, label: str, fn):
        """Run ``fn``; a failure is recorded under ``errors`` and the benchmark goes on."""
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - recorded in the results, reported by the exit code
            self.errors[label] = f"{type(exc).__name__}: {exc}"
            print(f"\n{label} failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
            return None

    @contextlib.contextmanager
    def until_done(self):
        """Mark the run complete if the block ends normally; on SIGTERM (``timeout``) or ^C keep what was
        measured; save either way."""

        def interrupted(signum, frame):
            raise KeyboardInterrupt(f"signal {signum}")

        previous = signal.signal(signal.SIGTERM, interrupted)
        try:
            yield
            self.results["meta"]["is_complete"] = True
        except KeyboardInterrupt as exc:
            self.results["meta"]["interrupted"] = str(exc) or "KeyboardInterrupt"
        finally:
            signal.signal(signal.SIGTERM, previous)
            self.save()

def canonical_key_chunk(canonical_attention: str) -> int | None:
    """The fast path's ``canonical_key_chunk`` for a canonical pass on ``canonical_attention`` (the benchmarks'
    ``FixedShapePolicy(attention_kernel=...)``, at its default ``key_chunk``): the chunk of the chunked kernel."""
    from llm42.policies.fixed_shape import DEFAULT_KEY_CHUNK

    return DEFAULT_KEY_CHUNK if canonical_attention == "chunked" else None
