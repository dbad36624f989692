"""The benchmark suite: every mode on the same request sets, offline and online, plus a T x G sweep.

Phases, in priority order; each ends by its share of the time budget:

1. offline: each workload, every mode; the ``no_batching`` outputs are the
   reference every deterministic ``dvr@p`` output is checked against, and a
   few ShareGPT-like requests are re-run alone through ``BatchInvariantPolicy``
   to check the ``batch_invariant`` outputs.
2. online: the ShareGPT-like requests with Poisson arrivals at several loads
   (fractions of the offline ``nondet`` request rate), submitted between
   engine steps as the wall clock reaches their arrival.
3. sweep: window T x group G for one mode on the ShareGPT-like requests.
"""

from __future__ import annotations

import datetime
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from llm42.bench.hostprobe import host_probe
from llm42.bench.metrics import RunResult, summarize
from llm42.bench.models import build_model
from llm42.bench.modes import (
    BATCH_INVARIANT,
    DVR_SHARES,
    NO_BATCHING,
    NONDET,
    all_modes,
    deterministic_order,
    mode_by_name,
)
from llm42.bench.runner import WARMUP_KV_TOKENS, Engine, batch_invariance_check, run_offline, run_online
from llm42.bench.scales import Scale
from llm42.bench.workloads import FIRST_TOKEN_ID, Workload, fixed_shape, poisson_arrivals, sharegpt_like


PHASES = ("offline", "online", "sweep")


@dataclass(frozen=True)
class SuiteConfig:
    """What to benchmark: device, model ('tiny', 'stories260k', '8b' or a checkpoint path), dtype, scale."""

    device: str
    model: str
    dtype: torch.dtype
    scale: Scale
    seed: int = 0
    lm_head_std: float | None = None  # None: the model's default (see llm42.bench.models)
    dvr_shares: tuple[int, ...] = DVR_SHARES
    phases: tuple[str, ...] = PHASES  # any subset, run in PHASES order
    use_cuda_graphs: bool = True


_SWEEP_KEYS = ("is_complete", "output_tokens_per_s", "ratio_to_nondet", "rollbacks_per_request",
               "recompute_share", "recompute_share_deterministic", "engine")


def phase_deadlines(started: float, scale: Scale, phases: tuple[str, ...]) -> dict[str, float]:
    """Each requested phase ends at ``started`` + its cumulative share of the budget."""
    shares = {p: s for p, s in zip(PHASES, scale.phase_shares) if p in phases}
    total = sum(shares.values()) or 1.0
    deadlines, cumulative = {}, 0.0
    for phase in PHASES:
        if phase in shares:
            cumulative += shares[phase] / total
            deadlines[phase] = started + cumulative * scale.budget_s
    return deadlines


def build_workloads(scale: Scale, *, vocab_size: int, seed: int) -> list[Workload]:
    workloads = [sharegpt_like(scale.num_requests, length_scale=scale.length_scale, vocab_size=vocab_size,
                               seed=seed)]
    for num_input, num_output in scale.fixed_shapes:
        workloads.append(fixed_shape(num_input, num_output, scale.num_requests, length_scale=scale.length_scale,
                                     vocab_size=vocab_size, seed=seed))
    return workloads


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def git_info(repo: Path) -> dict:
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    status = git("status", "--porcelain")
    return {"commit": git("rev-parse", "HEAD"), "is_dirty": None if status is None else bool(status)}


def device_info(device: torch.device) -> dict:
    info = {"type": device.type, "torch": torch.__version__, "python": platform.python_version(),
            "host_cpu": platform.processor() or platform.machine(), "torch_threads": torch.get_num_threads()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(name=props.name, capability=f"{props.major}.{props.minor}",
                    memory_gib=round(props.total_memory / 2**30, 1), cuda=torch.version.cuda)
        try:
            import triton

            info["triton"] = triton.__version__
        except ImportError:
            info["triton"] = None
    else:
        info["name"] = "cpu"
    return info


class _Progress:
    """A tqdm bar over the planned runs; plain lines on stderr where tqdm is not installed."""

    def __init__(self, total: int, enabled: bool):
        self.enabled = enabled
        self.total = total
        self.count = 0
        self.bar = None
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self.bar = tqdm(total=total, unit="run", dynamic_ncols=True)

    def start(self, label: str) -> None:
        if self.bar is not None:
            self.bar.set_description(label)
        elif self.enabled:
            print(f"[{self.count + 1}/{self.total}] {label}", file=sys.stderr, flush=True)

    def done(self) -> None:
        self.count += 1
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


@dataclass
class _Suite:
    """The state the phases share: one engine, one deterministic order, the progress bar, what was skipped."""

    config: SuiteConfig
    engine: Engine
    workloads: list[Workload]
    det_order: list[int]
    bar: _Progress
    skipped: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def sharegpt(self) -> Workload:
        return self.workloads[0]

    def guarded(self, label: str, deadline: float, fn: Callable[[], RunResult | dict]) -> RunResult | dict | None:
        """Run ``fn`` unless ``deadline`` has passed (then ``label`` is recorded as skipped).

        A run that raises is recorded under ``errors`` (and printed) and the suite
        goes on, so one failing mode on an untried device still leaves the others' results.
        """
        self.bar.start(label)
        result = None
        if time.perf_counter() > deadline:
            self.skipped.append(label)
        else:
            try:
                result = fn()
            except Exception as exc:  # noqa: BLE001 - recorded in the results and reported by run_all's exit code
                self.errors[label] = f"{type(exc).__name__}: {exc}"
                print(f"\n{label} failed:\n{traceback.format_exc()}", file=sys.stderr)
        self.bar.done()
        return result

    def offline(self, deadline: float) -> tuple[dict, dict, RunResult | None]:
        """Every mode on every workload; returns (results, checks, the ShareGPT-like nondet run)."""
        scale, engine = self.config.scale, self.engine
        results, checks, sharegpt_nondet = {}, {}, None
        for workload in self.workloads:
            runs: dict[str, RunResult] = {}
            for mode in all_modes(self.config.dvr_shares):
                limit = scale.no_batching_max_requests if mode.is_one_at_a_time else None
                run = self.guarded(f"offline {workload.name} {mode.name}", deadline, lambda m=mode, n=limit: (
                    run_offline(engine, workload, m, det_order=self.det_order, deadline=deadline, max_requests=n)))
                if run is not None:
                    runs[mode.name] = run
            nondet = runs.get(NONDET.name)
            reference = None
            if NO_BATCHING.name in runs:
                reference = {r.index: r.token_ids for r in runs[NO_BATCHING.name].records if r.is_finished}
            results[workload.name] = {
                "workload": workload.summary(),
                "modes": {name: summarize(run, nondet=nondet, reference=reference) for name, run in runs.items()},
            }
            if workload is self.sharegpt:
                sharegpt_nondet = nondet
                if BATCH_INVARIANT.name in runs:
                    check = self.guarded("batch-invariance check", deadline, lambda: batch_invariance_check(
                        engine, workload, runs[BATCH_INVARIANT.name], num_requests=scale.bi_check_requests,
                        deadline=deadline))
                    if check is not None:
                        checks["batch_invariance"] = check
        checks["determinism"] = _determinism_totals(results)
        return results, checks, sharegpt_nondet

    def online(self, deadline: float, sharegpt_nondet: RunResult | None) -> dict:
        """Poisson arrivals at each load; the capacity is the offline nondet request rate of the full set."""
        scale, sharegpt = self.config.scale, self.sharegpt
        if sharegpt_nondet is None:
            sharegpt_nondet = self.guarded("offline sharegpt nondet (online capacity)", deadline, lambda: (
                run_offline(self.engine, sharegpt, NONDET, det_order=self.det_order, deadline=deadline)))
        if sharegpt_nondet is None:
            return {}
        capacity_rps = sharegpt.num_requests / sharegpt_nondet.elapsed_s
        arriving = sharegpt.head(scale.online_num_requests)
        results = {}
        for load in scale.online_loads:
            rate = load * capacity_rps
            arrivals = poisson_arrivals(arriving.num_requests, rate, seed=self.config.seed)
            runs = {}
            for name in scale.online_modes:
                mode = mode_by_name(name, self.config.dvr_shares)
                run = self.guarded(f"online load {load} {name}", deadline, lambda m=mode: run_online(
                    self.engine, arriving, m, arrivals, det_order=self.det_order, deadline=deadline))
                if run is not None:
                    runs[name] = run
            nondet = runs.get(NONDET.name)
            results[f"{sharegpt.name}@load{load}"] = {
                "workload": arriving.summary(),
                "load": load,
                "rate_rps": rate,
                "capacity_rps": capacity_rps,
                "modes": {name: summarize(run, nondet=nondet, keep_latencies=True) for name, run in runs.items()},
            }
        return results

    def sweep(self, deadline: float) -> dict:
        """One mode at every (T, G), against a nondet run of the same requests."""
        scale = self.config.scale
        mode = mode_by_name(scale.sweep_mode, self.config.dvr_shares)
        swept = self.sharegpt.head(scale.sweep_num_requests)
        nondet = self.guarded("sweep nondet", deadline, lambda: run_offline(
            self.engine, swept, NONDET, det_order=self.det_order, deadline=deadline))
        points = []
        for window in scale.sweep_windows:
            for group in scale.sweep_groups:
                run = self.guarded(f"sweep T={window} G={group}", deadline, lambda w=window, g=group: run_offline(
                    self.engine, swept, mode, det_order=self.det_order, deadline=deadline, window=w, group=g))
                if run is not None:
                    summary = summarize(run, nondet=nondet)
                    points.append({"window": window, "group": group, "rows": window * group,
                                   **{k: summary[k] for k in _SWEEP_KEYS}})
        return {"workload": swept.summary(), "mode": mode.name,
                "nondet_output_tokens_per_s": nondet.tokens_per_s if nondet else None, "points": points}


def _num_runs(config: SuiteConfig, num_workloads: int) -> int:
    scale, total = config.scale, 0
    if "offline" in config.phases:
        total += num_workloads * len(all_modes(config.dvr_shares)) + 1
    if "online" in config.phases:
        total += len(scale.online_loads) * len(scale.online_modes)
    if "sweep" in config.phases:
        total += len(scale.sweep_windows) * len(scale.sweep_groups) + 1
    return total


def run_suite(config: SuiteConfig, *, progress: bool = True, repo: Path | None = None) -> dict:
    """Run every phase in ``config.phases``; returns the JSON-ready results."""
    started = time.perf_counter()
    scale = config.scale
    device = torch.device(config.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda was asked for but torch sees no CUDA device")
    unknown = set(config.phases) - set(PHASES)
    if unknown:
        raise ValueError(f"unknown phases {sorted(unknown)}; known: {PHASES}")
    for name in (*scale.online_modes, scale.sweep_mode):
        mode_by_name(name, config.dvr_shares)  # fail on a bad name before any work
    deadlines = phase_deadlines(started, scale, config.phases)

    # lengths do not depend on the vocabulary: size the model's context from them, then build the real set
    sizing = build_workloads(scale, vocab_size=FIRST_TOKEN_ID + 1, seed=config.seed)
    max_positions = _round_up(max(w.max_total_tokens for w in sizing), 256)
    model = build_model(config.model, device=device, dtype=config.dtype, max_positions=max_positions,
                        seed=config.seed, lm_head_std=config.lm_head_std)
    workloads = build_workloads(scale, vocab_size=model.cfg.vocab_size, seed=config.seed)
    kv_tokens = max(w.num_kv_tokens for w in workloads) + WARMUP_KV_TOKENS
    engine = Engine(model, scale.window, scale.group, kv_tokens, max_num_seqs=max(w.num_requests for w in workloads),
                    use_cuda_graphs=config.use_cuda_graphs)
    suite = _Suite(config, engine, workloads,
                   deterministic_order(scale.num_requests, seed=config.seed),
                   _Progress(_num_runs(config, len(workloads)), progress))
    offline, checks, sharegpt_nondet = {}, {}, None
    try:
        if "offline" in config.phases:
            offline, checks, sharegpt_nondet = suite.offline(deadlines["offline"])
        online = suite.online(deadlines["online"], sharegpt_nondet) if "online" in config.phases else {}
        sweep = suite.sweep(deadlines["sweep"]) if "sweep" in config.phases else None
    finally:
        suite.bar.close()

    dtype_name = model.summary()["dtype"]
    if device.type == "cpu":
        label = (f"CPU smoke run with a tiny model ({model.name}, {dtype_name}): checks the harness end to end; "
                 "NOT representative of GPU performance")
        short_label = f"CPU smoke run, {model.name} model (not representative)"
    else:
        label = short_label = f"{device_info(device)['name']}, model {model.name} ({dtype_name})"
    return _jsonable({
        "label": label,
        "short_label": short_label,
        "meta": {
            "started_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "elapsed_s": time.perf_counter() - started,
            "device": device_info(device),
            "host_probe": host_probe(),  # the host's speed, to compare runs across machines
            "model": model.summary(),
            "window": scale.window,
            "group": scale.group,
            "canonical_rows": scale.window * scale.group,
            "scale": vars(scale),
            "phases": config.phases,
            "seed": config.seed,
            "use_cuda_graphs": config.use_cuda_graphs and device.type == "cuda",
            "kv_cache_tokens": kv_tokens,
            "git": git_info(repo or Path.cwd()),
            "notes": [
                "throughput depends on shapes only; rollbacks and recompute depend on how peaked the logits "
                "are, so on random weights they are indicative only",
                "no_batching serves at most scale.no_batching_max_requests requests (deterministic ones first); "
                "its outputs are the reference for the determinism check",
                "online loads are fractions of the offline nondet request rate of the full ShareGPT-like set",
            ],
        },
        "offline": offline,
        "online": online,
        "sweep": sweep,
        "checks": checks,
        "skipped": suite.skipped,
        "errors": suite.errors,
    })


def _jsonable(value):
    """Tuples become lists, so the dict equals its own JSON round trip."""
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _determinism_totals(offline: dict[str, dict]) -> dict:
    num_checked = num_identical = 0
    mismatched = []
    for workload, entry in offline.items():
        for mode, summary in entry["modes"].items():
            det = summary.get("determinism")
            if det is None or mode == NO_BATCHING.name:
                continue
            num_checked += det["num_checked"]
            num_identical += det["num_identical"]
            mismatched += [f"{workload}/{mode}/{i}" for i in det["mismatched_requests"]]
    return {"reference": NO_BATCHING.name, "num_checked": num_checked, "num_identical": num_identical,
            "mismatched": mismatched, "is_ok": num_checked > 0 and num_checked == num_identical}
