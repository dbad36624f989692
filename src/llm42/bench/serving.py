"""The serving-scale benchmark (``benchmarks/serving.py``): the engine at full batch, offline and online.

One model per run (the 8B shape with random weights, or a checkpoint such as
SmolLM2-135M-Instruct), in this order, each phase ending by its share of
``--budget-s`` (time a phase leaves unused carries over; the budget starts once
the model is loaded, so converting a GGUF file the first time costs none of it):

1. **ceilings**: copy bandwidth and GEMM rate, measured now (``devicetime``).
2. **steady decode** at ``--steady-batch`` (256): every request prefilled, then
   ``steady_steps`` engine steps that are pure decode. Reported: the host wall
   time per ``gen.step()`` (device drained once before and once after, never
   in between) and the replay time of the same decode-graph bucket alone (CUDA
   events, the same slots and positions). ``wall_over_kernel`` = wall / replay
   (target <= 1.15); ``gpu_busy_fraction`` = replay / wall: the share of the
   step's wall time the device spends on the step's kernels. With the overlap
   on and off.
3. **offline**: N ShareGPT-like requests at t = 0, every mode on the same set:
   ``nondet``, ``nondet_sync`` (overlap off), ``dvr@10/50/100``,
   ``batch_invariant``. N is the largest count (<= ``--num-requests``) whose
   runs fit the phase, estimated from a probe run of the first
   ``max_num_seqs`` requests; each mode also has its own deadline. Reported per
   mode: output tok/s, ratio to nondet, TTFT / ITL / TPOT / e2e percentiles
   with free and deterministic requests apart, engine steps and ms per step,
   rollbacks and recompute, and the fraction of the request set's roofline
   bound (``roofline``). Deterministic outputs are checked equal across the
   dvr modes (each smaller share's deterministic set is in every larger one's).
4. **transformers** (checkpoints only): ``generate`` with a static cache at
   batch 256, 256 new tokens (``hf_generate``, in a subprocess with a timeout),
   against llm42 ``nondet`` on the same prompts.
5. **online**: Poisson arrivals at loads (fractions of the offline nondet
   request rate) for the online modes; free requests' ITL p50/p99 relative to
   ``nondet`` at the same load (target <= 1.15 for dvr@50).

Results are written to ``--out`` after every run (atomically), so a run cut by
the budget or killed by ``timeout`` leaves every finished figure on disk.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from llm42.bench.devicetime import Budget, measure_ceilings, median_ms
from llm42.bench.metrics import RunResult, cdf, percentile, summarize
from llm42.bench.models import BenchModel, build_model
from llm42.bench.modes import NONDET, deterministic_order, mode_by_name
from llm42.bench.roofline import roofline
from llm42.bench.runner import WARMUP_KV_TOKENS, Clock, Engine, capture_decode_graphs, run_offline, run_online
from llm42.bench.script import (
    OnDevice, Run, add_common_args, canonical_key_chunk, finish, log, names, replot, run_meta,
)
from llm42.bench.suite import device_info
from llm42.bench.workloads import FIRST_TOKEN_ID, Workload, chat_like, fixed_shape, poisson_arrivals, sharegpt_like
from llm42.generator import DVRGenerator
from llm42.params import SamplingParams
from llm42.scheduler import ADMISSIONS, DEFAULT_ORDER, ORDERS

OFFLINE_MODES = ("nondet", "nondet_sync", "dvr@10", "dvr@50", "dvr@100", "batch_invariant")
ONLINE_MODES = ("nondet", "dvr@10", "dvr@50", "batch_invariant")
# rough run time relative to nondet, to size the request count to the budget (each run also has a deadline)
MODE_COST = {"nondet": 1.0, "nondet_sync": 1.3, "dvr@10": 1.2, "dvr@25": 1.4, "dvr@50": 1.6, "dvr@100": 2.2,
             "batch_invariant": 1.8}
PHASE_SHARES = {"steady": 0.12, "offline": 0.45, "transformers": 0.13, "online": 0.30}
# a checkpoint's run also times transformers' generate (compilation included)
CHECKPOINT_PHASE_SHARES = {"steady": 0.10, "offline": 0.37, "transformers": 0.25, "online": 0.28}
PHASES = tuple(PHASE_SHARES)  # in the order they run


@dataclass(frozen=True)
class ServingConfig:
    """What one serving benchmark run does (``benchmarks/serving.py --help`` documents each field)."""

    device: str
    model: str
    dtype: torch.dtype
    budget_s: float
    window: int = 32
    group: int = 8
    max_num_seqs: int = 256
    max_fast_tokens: int = 512
    num_requests: int = 1000
    length_scale: float = 1.0
    prompts: str = "auto"  # sharegpt (random ids), chat (needs a tokenizer), auto (chat when there is one)
    offline_modes: tuple[str, ...] = OFFLINE_MODES
    online_modes: tuple[str, ...] = ONLINE_MODES
    online_loads: tuple[float, ...] = (0.4, 0.7, 0.9)
    online_num_requests: int = 500
    steady_batch: int = 256
    steady_steps: int = 128
    steady_prompt_tokens: int = 128
    hf_compare: bool = True
    hf_batch: int = 256
    hf_prompt_tokens: int = 128
    hf_new_tokens: int = 256
    hf_compile: bool = True
    seed: int = 0
    lm_head_std: float | None = None
    use_cuda_graphs: bool = True
    canonical_attention: str = "tiled"
    canonical_gemm: str = "cublas"
    canonical_tile_m: int = 64
    fast_decode_kernel: str = "split"
    max_canonical_tokens: int | None = None
    canonical_stream: bool | None = None  # None: the engine's default (on CUDA: on)
    draft_ahead: bool = True
    wide_verify: bool | None = None  # None: the engine's default (on CUDA: on)
    canonical_gemm_rows: int | None = None  # FixedShapePolicy(gemm_rows=...): every canonical GEMM at that M (CUDA)
    gc_freeze: bool = True  # every timed run inside ``frozen_gc``, as ``llm42 serve`` serves
    prompt_drafts: bool = False  # DVRGenerator(prompt_drafts=...): drafting from a fast run of deterministic prompts
    canonical_sms: int | None = None  # DVRGenerator(canonical_sms=...): the canonical pass on that many SMs (CUDA)
    canonical_sms_max_rows: int | None = None  # DVRGenerator(canonical_sms_max_rows=...): wider passes every SM
    scheduler_order: str = DEFAULT_ORDER  # DefaultScheduler(order=...): who is served first where rows are short
    scheduler_admission: str = "arrival"  # DefaultScheduler(admission=...): who is admitted first
    # the phases to run (``PHASES``), the budget shared among them in proportion to their usual shares; "online"
    # needs "offline" (its loads are fractions of the offline nondet rate)
    phases: tuple[str, ...] = PHASES

    def fast_policy(self):
        """The non-batch-invariant modes' fast path: None (the default FastPolicy) unless a decode kernel is set."""
        if self.fast_decode_kernel == "split":
            return None
        from llm42.policies import FastPolicy

        return FastPolicy(decode_kernel=self.fast_decode_kernel, canonical_key_chunk=canonical_key_chunk(
            self.canonical_attention), canonical_tile_m=self.canonical_tile_m)

    def __post_init__(self) -> None:
        for name in (*self.offline_modes, *self.online_modes):
            mode_by_name(name)
        if self.prompts not in ("auto", "sharegpt", "chat"):
            raise ValueError(f"prompts must be auto, sharegpt or chat, got {self.prompts!r}")
        if "nondet" not in self.offline_modes:
            raise ValueError("offline_modes must include nondet (the others' ratios and the online loads refer to it)")
        unknown = [p for p in self.phases if p not in PHASES]
        if unknown or not self.phases:
            raise ValueError(f"phases must be a non-empty subset of {', '.join(PHASES)}, got {self.phases!r}")
        if "online" in self.phases and "offline" not in self.phases:
            raise ValueError("phases: online needs offline (its loads are fractions of the offline nondet rate)")


def phase_shares(usual: dict[str, float], phases: tuple[str, ...]) -> dict[str, float]:
    """Each of ``PHASES``' share of the budget: ``usual``'s for the phases run, scaled to sum to 1; 0 for the rest."""
    total = sum(usual[p] for p in phases)
    return {p: usual[p] / total if p in phases else 0.0 for p in PHASES}


# -- checkpoints ------------------------------------------------------------------------------------

def prepare_checkpoint(model: str, cache_dir: Path | None) -> str:
    """A ``.gguf`` (file or directory holding one) becomes a float32 HF directory, converted once and cached.

    llm42 and transformers then both load the directory (about a second), instead of
    parsing the GGUF file once each. Other names pass through unchanged.
    """
    path = Path(model)
    if not path.exists():
        return model
    from llm42.model.gguf import convert_gguf, find_gguf_file

    gguf = find_gguf_file(path)
    if gguf is None:
        return model
    cache_dir = Path(tempfile.gettempdir()) / "llm42_models" if cache_dir is None else cache_dir
    target = cache_dir / gguf.stem
    if not (target / "config.json").is_file():
        started = time.perf_counter()
        partial = cache_dir / f".{gguf.stem}.partial"
        if partial.exists():
            import shutil

            shutil.rmtree(partial)
        convert_gguf(gguf, partial, dtype=torch.float32)
        partial.rename(target)
        log(f"converted {gguf} to {target} in {time.perf_counter() - started:.1f} s")
    return str(target)


# -- workloads --------------------------------------------------------------------------------------

def build_workload(model: BenchModel, config: ServingConfig, num_requests: int) -> Workload:
    use_chat = config.prompts == "chat" or (config.prompts == "auto" and model.tokenizer is not None)
    if use_chat:
        return chat_like(num_requests, tokenizer=model.tokenizer, length_scale=config.length_scale,
                         vocab_size=model.cfg.vocab_size, seed=config.seed)
    return sharegpt_like(num_requests, length_scale=config.length_scale, vocab_size=model.cfg.vocab_size,
                         seed=config.seed)


def _max_positions(config: ServingConfig) -> int:
    sizing = sharegpt_like(config.num_requests, length_scale=config.length_scale, vocab_size=FIRST_TOKEN_ID + 1,
                           seed=config.seed)
    # chat prompts may overshoot their drawn length by one context sentence
    need = max(sizing.max_total_tokens + 64, config.steady_prompt_tokens + _steady_new_tokens(config) + 16,
               config.hf_prompt_tokens + config.hf_new_tokens + 16)
    return -(-need // 256) * 256


STEADY_WARM_STEPS = 8


def _steady_new_tokens(config: ServingConfig) -> int:
    """Enough output that no request finishes before the timed steps end: the first requests start decoding
    while the last are still prefilling (decode rows share a step's ``max_fast_tokens`` with prefill rows)."""
    prefill_rows_per_step = max(16, max(config.max_fast_tokens, config.steady_batch) - config.steady_batch)
    ramp = -(-config.steady_batch * config.steady_prompt_tokens // prefill_rows_per_step)
    return ramp + STEADY_WARM_STEPS + config.steady_steps + 16


# -- steady decode ----------------------------------------------------------------------------------

def steady_decode(model: BenchModel, config: ServingConfig, *, is_overlapped: bool, deadline: float) -> dict:
    """Pure decode at ``steady_batch``: gen.step() wall per step vs the same bucket's graph replay alone."""
    batch, steps = config.steady_batch, config.steady_steps
    num_warm = STEADY_WARM_STEPS
    new_tokens = _steady_new_tokens(config)
    gen = DVRGenerator(model.weights, model.cfg, window=config.window, group=config.group, max_num_seqs=batch,
                       max_fast_tokens=max(config.max_fast_tokens, batch),
                       kv_cache_tokens=batch * (config.steady_prompt_tokens + new_tokens + 32) + WARMUP_KV_TOKENS,
                       use_cuda_graphs=config.use_cuda_graphs, overlap=is_overlapped,
                       fast_policy=config.fast_policy())
    notes = capture_decode_graphs(gen, buckets=(batch,)) if gen.fast_step.decode_graphs is not None else []
    rng = random.Random(f"steady-{config.seed}")
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    for _ in range(batch):
        gen.submit([rng.randrange(FIRST_TOKEN_ID, model.cfg.vocab_size) for _ in range(config.steady_prompt_tokens)],
                   params)
    started: set[int] = set()
    while len(started) < batch:  # prefill (timed nowhere)
        if time.perf_counter() > deadline:
            return {"batch": batch, "is_overlapped": is_overlapped, "is_complete": False,
                    "notes": notes + ["deadline passed during prefill"]}
        started.update(rid for rid, tokens in gen.step().items() if tokens)
    for _ in range(num_warm):
        gen.step()
    clock = Clock(gen.device)
    before = dict(gen.stats)
    t0 = clock.start()
    for _ in range(steps):
        gen.step()
    wall_s = clock.stop() - t0
    delta = {k: gen.stats[k] - before[k] for k in ("steps", "fast_steps", "fast_tokens")}
    wall_ms = wall_s / steps * 1e3
    out = {
        "batch": batch, "is_overlapped": is_overlapped, "is_complete": True, "steps": steps,
        "prompt_tokens": config.steady_prompt_tokens, "wall_ms_per_step": wall_ms,
        "decode_rows_per_step": delta["fast_tokens"] / steps, "output_tokens_per_s": batch / wall_ms * 1e3,
        "graph_replay_ms": None, "wall_over_kernel": None, "gpu_busy_fraction": None, "notes": notes,
    }
    graphs = gen.fast_step.decode_graphs
    if graphs is not None and gen.device.type == "cuda":
        # the batch buffer still holds the last step's slots; each replay is undone before the next
        state = gen.decode_state
        saved = state.snapshot()
        replay_ms = median_ms(lambda: graphs.run(batch, (False, False)), gen.device, reps=20,
                              reset=lambda: state.restore(saved))
        out.update(graph_replay_ms=replay_ms, wall_over_kernel=wall_ms / replay_ms,
                   gpu_busy_fraction=replay_ms / wall_ms)
    del gen
    _release(model)
    return out


def _release(model: BenchModel) -> None:
    import gc

    if model.weights.device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()


# -- offline and online -----------------------------------------------------------------------------

KV_FREE_FRACTION = 0.6  # the share of the CUDA memory free after the weights the benchmarks' K/V store may take


def kv_tokens_for(model: BenchModel, workload: Workload, max_num_seqs: int, *,
                  free_fraction: float = KV_FREE_FRACTION) -> int:
    """K/V positions for any ``max_num_seqs`` of the requests at once (admission reserves a request's whole
    length), capped on CUDA at ``free_fraction`` of the memory free now."""
    if not 0.0 < free_fraction < 1.0:
        raise ValueError(f"kv_tokens_for free_fraction must be in (0, 1), got {free_fraction!r}")
    totals = sorted((len(r.prompt) + r.max_new_tokens for r in workload.requests), reverse=True)
    need = sum(totals[:max_num_seqs]) + WARMUP_KV_TOKENS
    if model.weights.device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(model.weights.device)
        per_token = 2 * model.cfg.num_layers * model.cfg.kv_size * model.weights.dtype.itemsize
        need = min(need, int(free_fraction * free) // per_token)
    return need


def _engine(model: BenchModel, config: ServingConfig, workload: Workload) -> Engine:
    return Engine(model, config.window, config.group, kv_cache_tokens=kv_tokens_for(model, workload,
                                                                                    config.max_num_seqs),
                  max_num_seqs=config.max_num_seqs, use_cuda_graphs=config.use_cuda_graphs,
                  max_fast_tokens=config.max_fast_tokens, canonical_attention=config.canonical_attention,
                  canonical_gemm=config.canonical_gemm, canonical_tile_m=config.canonical_tile_m,
                  fast_policy=config.fast_policy(), max_canonical_tokens=config.max_canonical_tokens,
                  canonical_stream=config.canonical_stream, draft_ahead=config.draft_ahead,
                  wide_verify=config.wide_verify, canonical_gemm_rows=config.canonical_gemm_rows,
                  gc_freeze=config.gc_freeze, prompt_drafts=config.prompt_drafts, canonical_sms=config.canonical_sms,
                  canonical_sms_max_rows=config.canonical_sms_max_rows,
                  scheduler_order=config.scheduler_order, scheduler_admission=config.scheduler_admission)


def serving_summary(run: RunResult, *, nondet: RunResult | None) -> dict:
    """``summarize`` plus ms per engine step and the ITL CDFs of free and deterministic requests."""
    out = summarize(run, nondet=nondet)
    num_steps = run.stats.get("steps", 0)
    out["engine"]["steps"] = num_steps
    out["engine"]["ms_per_step"] = run.elapsed_s / num_steps * 1e3 if num_steps else None
    out["engine"]["output_tokens_per_step"] = run.num_output_tokens / num_steps if num_steps else None
    free = [r for r in run.records if not r.is_deterministic]
    det = [r for r in run.records if r.is_deterministic]
    out["itl_cdf_free"] = cdf([g for r in free for g in r.itl_s])
    out["itl_cdf_deterministic"] = cdf([g for r in det for g in r.itl_s])
    if nondet is not None and run is not nondet and free:
        mine = [g for r in free for g in r.itl_s]
        theirs = [g for r in nondet.records for g in r.itl_s]
        out["free_itl_vs_nondet"] = {
            f"p{q}_ratio": _ratio(percentile(mine, q), percentile(theirs, q)) for q in (50, 90, 99)}
    return out


def _ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def _det_consistency(runs: dict[str, RunResult]) -> dict:
    """Deterministic outputs of every dvr mode agree on every request deterministic in more than one."""
    outputs: dict[int, dict[str, list[int]]] = {}
    for name, run in runs.items():
        for r in run.records:
            if r.is_deterministic and r.is_finished:
                outputs.setdefault(r.index, {})[name] = r.token_ids
    shared = {i: by_mode for i, by_mode in outputs.items() if len(by_mode) > 1}
    mismatched = sorted(i for i, by_mode in shared.items() if len({tuple(t) for t in by_mode.values()}) > 1)
    return {"num_checked": len(shared), "num_identical": len(shared) - len(mismatched),
            "mismatched_requests": mismatched, "is_ok": not mismatched}


def _fit_requests(budget_s: float, probe: RunResult, probe_set: Workload, full: Workload, modes: tuple[str, ...],
                  setup_s: float) -> int:
    """The largest request count whose offline runs (every mode) fit ``budget_s``, at the probe's rate."""
    rate = probe.num_output_tokens / probe.elapsed_s if probe.elapsed_s > 0 else 0.0
    if rate <= 0:
        return probe_set.num_requests
    mean_out = sum(r.max_new_tokens for r in full.requests) / full.num_requests
    cost = sum(MODE_COST.get(m, 2.0) for m in modes)
    usable = budget_s - setup_s * len(modes)
    # below a few requests the figures mean nothing: keep some, and let each run's deadline cut it instead
    return max(min(16, full.num_requests), min(full.num_requests, int(usable * rate / (mean_out * cost))))


def probe_and_fit(run: Run, engine: Engine, full: Workload, modes: tuple[str, ...], *, det_order: list[int],
                  deadline: float, probe_size: int) -> tuple[Workload, RunResult | None, dict]:
    """Serve the first ``probe_size`` requests with nondet, then pick the largest head of ``full`` whose runs
    of every mode fit before ``deadline`` at the probe's rate. Returns (that head, the probe, probe figures)."""
    probe_set = full.head(probe_size)
    started = time.perf_counter()
    log(f"probe: nondet on {probe_set.num_requests} requests")
    probe = run.guarded("probe", lambda: run_offline(engine, probe_set, NONDET, det_order=det_order,
                                                    deadline=deadline))
    if probe is None:
        return probe_set, None, {}
    setup_s = max(0.0, time.perf_counter() - started - probe.elapsed_s)  # generator, graph capture, warm-up
    num = _fit_requests(deadline - time.perf_counter(), probe, probe_set, full, modes, setup_s)
    workload = full.head(num)
    info = {"num_requests": probe_set.num_requests, "output_tokens_per_s": probe.tokens_per_s,
            "elapsed_s": probe.elapsed_s, "setup_s": setup_s}
    return workload, (probe if workload is probe_set else None), info


def run_modes(run: Run, engine: Engine, workload: Workload, modes: tuple[str, ...], *, det_order: list[int],
              deadline: float, entry: dict, label: str, reuse: dict[str, RunResult] | None = None,
              no_batching_requests: int = 4, summary=None) -> dict[str, RunResult]:
    """Every mode on ``workload``, each with its own deadline (shares weighted by ``MODE_COST``); each run's
    summary goes to ``entry["modes"]`` and the results are saved after each run."""
    runs: dict[str, RunResult] = {}
    costs = [MODE_COST.get(m, 2.0) for m in modes]
    start, span = time.perf_counter(), max(0.0, deadline - time.perf_counter())
    summary = summary or (lambda result, runs: serving_summary(result, nondet=runs.get("nondet")))
    for i, name in enumerate(modes):
        mode = mode_by_name(name)
        mode_deadline = start + span * sum(costs[: i + 1]) / sum(costs)
        if reuse and name in reuse:
            result = reuse[name]
        else:
            log(f"{label} {name}")
            limit = no_batching_requests if mode.is_one_at_a_time else None
            result = run.guarded(f"{label} {name}", lambda m=mode, d=mode_deadline, n=limit: run_offline(
                engine, workload, m, det_order=det_order, deadline=d, max_requests=n))
        if result is None:
            continue
        runs[name] = result
        entry["modes"][name] = summary(result, runs)
        run.save()
    return runs


def offline_phase(run: Run, model: BenchModel, full: Workload, deadline: float, ceilings: dict) -> RunResult | None:
    config = run.config
    det_order = deterministic_order(full.num_requests, seed=config.seed)
    engine = _engine(model, config, full)
    workload, probe, probe_info = probe_and_fit(run, engine, full, config.offline_modes, det_order=det_order,
                                                deadline=deadline, probe_size=config.max_num_seqs)
    if not probe_info:
        return None
    bound = roofline(workload, model.weights, model.cfg, copy_GBps=ceilings["copy_GBps"],
                     matmul_TFLOPs=ceilings["matmul_TFLOPs"], max_num_seqs=config.max_num_seqs)
    entry = run.results["offline"] = {"workload": workload.summary(), "num_requests_asked": config.num_requests,
                                      "probe": probe_info, "roofline": bound, "modes": {}}
    log(f"offline: {workload.num_requests} requests x {len(config.offline_modes)} modes")
    runs = run_modes(run, engine, workload, config.offline_modes, det_order=det_order, deadline=deadline,
                     entry=entry, label="offline", reuse={"nondet": probe} if probe is not None else None,
                     summary=lambda result, runs: _with_roofline(
                         serving_summary(result, nondet=runs.get("nondet")), bound))
    entry["checks"] = {"deterministic_outputs_agree_across_dvr_modes": _det_consistency(
        {n: r for n, r in runs.items() if n.startswith("dvr@")})}
    run.save()
    return runs.get("nondet")


def _with_roofline(summary: dict, bound: dict) -> dict:
    summary["fraction_of_roofline"] = _ratio(summary["output_tokens_per_s"], bound["output_tokens_per_s"])
    summary["fraction_of_serial_bound"] = _ratio(summary["output_tokens_per_s"], bound["serial_output_tokens_per_s"])
    return summary


def online_phase(run: Run, model: BenchModel, full: Workload, nondet: RunResult, offline_set_size: int,
                 steady_ms: float | None, deadline: float) -> None:
    config = run.config
    capacity_rps = offline_set_size / nondet.elapsed_s
    det_order = deterministic_order(full.num_requests, seed=config.seed)
    engine = _engine(model, config, full)
    outputs = sorted(r.max_new_tokens for r in full.requests)
    step_s = (steady_ms or nondet.elapsed_s / max(1, nondet.stats.get("steps", 1)) * 1e3) / 1e3
    drain_s = outputs[int(0.99 * (len(outputs) - 1))] * step_s  # the last arrival's output, at full-batch speed
    num_runs = len(config.online_loads) * len(config.online_modes)
    setup_s = (run.results["offline"] or {}).get("probe", {}).get("setup_s", 2.0)  # generator, captures, warm-up
    span = deadline - time.perf_counter() - num_runs * (drain_s + setup_s)
    per_request_s = sum(1 / (load * capacity_rps) for load in config.online_loads) * len(config.online_modes)
    num = max(8, min(config.online_num_requests, full.num_requests, int(span / per_request_s)))
    arriving = full.head(num)
    run.results["online"] = {"capacity_rps": capacity_rps, "workload": arriving.summary(), "loads": {}}
    log(f"online: {num} requests, loads {config.online_loads}, capacity {capacity_rps:.2f} req/s")
    start, total = time.perf_counter(), max(0.0, deadline - time.perf_counter())
    weights = [1 / load for load in config.online_loads for _ in config.online_modes]
    k = 0
    for load in config.online_loads:
        rate = load * capacity_rps
        arrivals = poisson_arrivals(num, rate, seed=config.seed)
        runs: dict[str, RunResult] = {}
        entry = run.results["online"]["loads"][str(load)] = {"load": load, "rate_rps": rate, "modes": {}}
        for name in config.online_modes:
            k += 1
            run_deadline = start + total * sum(weights[:k]) / sum(weights)
            log(f"online load {load} {name}")
            result = run.guarded(f"online {load} {name}", lambda m=mode_by_name(name), d=run_deadline: run_online(
                engine, arriving, m, arrivals, det_order=det_order, deadline=d))
            if result is None:
                continue
            runs[name] = result
            entry["modes"][name] = serving_summary(result, nondet=runs.get("nondet"))
            run.save()


# -- transformers -----------------------------------------------------------------------------------

def transformers_phase(run: Run, model: BenchModel, deadline: float) -> None:
    """transformers' generate (subprocess, timeout) and llm42 nondet on the same prompts and shape."""
    config = run.config
    entry = run.results["transformers"] = {"batch": config.hf_batch, "prompt_tokens": config.hf_prompt_tokens,
                                           "new_tokens": config.hf_new_tokens}
    workload = fixed_shape(config.hf_prompt_tokens, config.hf_new_tokens, config.hf_batch, length_scale=1.0,
                           vocab_size=model.cfg.vocab_size, seed=config.seed, sampled_share=0.0)
    engine = Engine(model, config.window, config.group, workload.num_kv_tokens + WARMUP_KV_TOKENS,
                    max_num_seqs=config.hf_batch, use_cuda_graphs=config.use_cuda_graphs,
                    max_fast_tokens=config.max_fast_tokens, canonical_attention=config.canonical_attention,
                    canonical_gemm=config.canonical_gemm, canonical_tile_m=config.canonical_tile_m,
                    fast_policy=config.fast_policy(), gc_freeze=config.gc_freeze)
    det_order = deterministic_order(workload.num_requests, seed=config.seed)
    share = (deadline - time.perf_counter()) / 3
    mine = run.guarded("transformers llm42 side", lambda: run_offline(
        engine, workload, NONDET, det_order=det_order, deadline=time.perf_counter() + share))
    if mine is not None:
        entry["llm42"] = {"output_tokens_per_s": mine.tokens_per_s, "elapsed_s": mine.elapsed_s,
                          "is_complete": mine.is_complete, "steps": mine.stats.get("steps")}
        run.save()
    # compiled first (what transformers does with a static cache); if compilation outruns its share, eagerly
    attempts = [True, False] if config.hf_compile else [False]
    for i, compile in enumerate(attempts):
        is_last = i == len(attempts) - 1
        left = deadline - time.perf_counter()
        got = _hf_generate(model, config, compile=compile, timeout=max(1.0, left if is_last else 0.7 * left))
        entry.setdefault("hf_attempts", []).append({"compile": compile, **got})
        run.save()
        if "output_tokens_per_s" in got:
            entry["hf"] = got
            break
    else:
        entry["hf"] = {"error": entry["hf_attempts"][-1].get("error")}
    if mine is not None and "output_tokens_per_s" in entry["hf"]:
        entry["llm42_over_hf"] = mine.tokens_per_s / entry["hf"]["output_tokens_per_s"]
    run.save()


def _hf_generate(model: BenchModel, config: ServingConfig, *, compile: bool, timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "hf.json"
        command = [sys.executable, "-m", "llm42.bench.hf_generate", "--model", model.source, "--device",
                   config.device, "--dtype", str(model.weights.dtype).removeprefix("torch."), "--batch",
                   str(config.hf_batch), "--prompt-tokens", str(config.hf_prompt_tokens), "--new-tokens",
                   str(config.hf_new_tokens), "--seed", str(config.seed), "--json", str(out)]
        if not compile:
            command.append("--no-compile")
        log(f"transformers generate, compile={compile} (timeout {timeout:.0f} s)")
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=_subprocess_env())
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout:.0f} s (loading, warm-up and compilation included)"}
        if done.returncode != 0 or not out.is_file():
            return {"error": f"exit {done.returncode}: {done.stderr.strip()[-2000:]}"}
        return json.loads(out.read_text())


def _subprocess_env() -> dict:
    import os

    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


# -- the whole run ----------------------------------------------------------------------------------

def run_serving(config: ServingConfig, *, out: Path, repo: Path, cache_dir: Path | None = None) -> dict:
    loading = time.perf_counter()
    device = torch.device(config.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda was asked for but torch sees no CUDA device")
    model_name = prepare_checkpoint(config.model, cache_dir)
    model = build_model(model_name, device=device, dtype=config.dtype, max_positions=_max_positions(config),
                        seed=config.seed, lm_head_std=config.lm_head_std, with_tokenizer=config.prompts != "sharegpt")
    # the budget is the measurements': a first run's GGUF conversion must not cut the request set
    budget = Budget(config.budget_s)
    is_checkpoint = model.source is not None
    results = {
        "label": f"{device_info(device)['name']}, model {model.name} ({model.summary()['dtype']})"
                 + ("" if device.type == "cuda" else " — CPU smoke run, NOT representative"),
        "meta": {
            **run_meta(config, device, repo),
            "model": model.summary(),
            "load_s": budget.started - loading,
            "timing": "host clock at the return of gen.step(); device drained only at the start and end of a run",
        },
        "ceilings": None, "steady_decode": {}, "offline": None, "transformers": None, "online": None,
    }
    run = Run(config, out, budget, results)
    with run.until_done():
        results["ceilings"] = measure_ceilings(device)
        run.save()
        shares = phase_shares(CHECKPOINT_PHASE_SHARES if is_checkpoint and config.hf_compare else PHASE_SHARES,
                              config.phases)
        steady_deadline = budget.phase(shares["steady"])
        for is_overlapped in (True, False) if "steady" in config.phases else ():
            label = "overlap" if is_overlapped else "no_overlap"
            log(f"steady decode at batch {config.steady_batch} ({label})")
            got = run.guarded(f"steady {label}", lambda o=is_overlapped: steady_decode(
                model, config, is_overlapped=o, deadline=steady_deadline))
            if got is not None:
                results["steady_decode"][label] = got
                run.save()
        steady_ms = (results["steady_decode"].get("overlap") or {}).get("wall_ms_per_step")
        full = build_workload(model, config, config.num_requests)
        offline_deadline = budget.phase(shares["offline"])
        nondet = (offline_phase(run, model, full, offline_deadline, results["ceilings"])
                  if "offline" in config.phases else None)
        transformers_deadline = budget.phase(shares["transformers"])
        if "transformers" not in config.phases:
            results["transformers"] = {"skipped": "not among --phases"}
        elif is_checkpoint and config.hf_compare:
            transformers_phase(run, model, transformers_deadline)
        else:
            results["transformers"] = {"skipped": "needs a checkpoint (--model PATH)" if not is_checkpoint
                                       else "--no-hf"}
        if "online" in config.phases and nondet is not None and config.online_modes and config.online_loads:
            offline_size = results["offline"]["workload"]["num_requests"]
            online_phase(run, model, full, nondet, offline_size, steady_ms, budget.phase(shares["online"]))
    return results


# -- command line -----------------------------------------------------------------------------------

USAGE = """examples:
  CPU smoke run (tiny random model, seconds):
    PYTHONPATH=src python3 benchmarks/serving.py --device cpu --model tiny --budget-s 20
  one H200, the 8B shape with random weights, then SmolLM2 (a .gguf or HF directory):
    PYTHONPATH=src python3 benchmarks/serving.py --device cuda --model 8b --budget-s 400
    PYTHONPATH=src python3 benchmarks/serving.py --device cuda --model /root/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  redraw the plots of a saved run:
    PYTHONPATH=src python3 benchmarks/serving.py --replot benchmarks/results/serving_cuda_8b.json
"""

def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x.strip())


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="llm42 at serving scale: steady decode, offline and online "
                                "ShareGPT-like load, roofline, transformers' generate (docs/benchmarks.md).",
                                epilog=USAGE, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p, budget_s=480.0, out_help="results JSON (default: benchmarks/results/"
                    "serving_<device>_<model>.json)")
    p.add_argument("--model", default=None, help="8b, tiny, stories260k, a HF directory or a .gguf file "
                   "(default: 8b on cuda, tiny on cpu)")
    p.add_argument("--num-requests", type=int, default=None,
                   help="offline requests at most; the budget may cut it (default: 1000 on cuda, 12 on cpu)")
    p.add_argument("--length-scale", type=float, default=None,
                   help="multiplies every ShareGPT-like length (default: 1 on cuda, 1/16 on cpu)")
    p.add_argument("--prompts", choices=("auto", "sharegpt", "chat"), default="auto",
                   help="random ids (sharegpt) or chat text through the tokenizer (auto: chat when there is one)")
    p.add_argument("--max-num-seqs", type=int, default=None, help="default: 256 on cuda, 8 on cpu")
    p.add_argument("--max-fast-tokens", type=int, default=512)
    p.add_argument("--max-canonical-tokens", type=int, default=None,
                   help="rows one canonical pass may take (a multiple of R; default: the engine's)")
    p.add_argument("--canonical-stream", action=argparse.BooleanOptionalAction, default=None,
                   help="CUDA: each canonical pass on its own stream, beside the fast steps (DVRGenerator knob; "
                        "default: the engine's, on for CUDA)")
    p.add_argument("--no-draft-ahead", action="store_true",
                   help="deterministic requests wait for their window's pass instead of drafting ahead "
                        "(DVRGenerator(draft_ahead=False))")
    p.add_argument("--wide-verify", action=argparse.BooleanOptionalAction, default=None,
                   help="verify windows fill canonical passes of more than R rows (DVRGenerator knob; default: the "
                        "engine's, on for CUDA)")
    p.add_argument("--canonical-gemm-rows", type=int, default=None,
                   help="CUDA: every canonical GEMM at this M, a wide pass's rows in blocks of it "
                        "(FixedShapePolicy(gemm_rows=...): its own canonical config; default: M = R)")
    p.add_argument("--gc-freeze", action=argparse.BooleanOptionalAction, default=True,
                   help="time every run with the objects built before it out of the cyclic collector's full passes "
                        "(llm42.gc_freeze.frozen_gc, as `llm42 serve` serves; default on)")
    p.add_argument("--prompt-drafts", action="store_true",
                   help="deterministic requests draft from a fast run of their prompts while the prompts' canonical "
                        "passes wait (DVRGenerator(prompt_drafts=True))")
    p.add_argument("--canonical-sms", type=int, default=None, metavar="N",
                   help="CUDA: the canonical pass on a green context of N SMs (DVRGenerator(canonical_sms=N), `llm42 "
                        "serve --canonical-sms N`; docs/serving.md; default: every SM)")
    p.add_argument("--canonical-sms-max-rows", type=int, default=None, metavar="ROWS",
                   help="with --canonical-sms: only passes of at most ROWS rows confined, wider ones on every SM "
                        "(DVRGenerator(canonical_sms_max_rows=ROWS), `llm42 serve --canonical-sms-max-rows`)")
    p.add_argument("--order", choices=ORDERS, default=DEFAULT_ORDER,
                   help=f"DefaultScheduler(order=...), every mode alike (`llm42 serve --order`; default: "
                        f"{DEFAULT_ORDER})")
    p.add_argument("--admission", choices=ADMISSIONS, default="arrival",
                   help="DefaultScheduler(admission=...), every mode alike (`llm42 serve --admission`; default: "
                        "arrival)")
    p.add_argument("--modes", default=",".join(OFFLINE_MODES), help="offline modes (must include nondet)")
    p.add_argument("--online-modes", default=",".join(ONLINE_MODES), help="online modes ('' skips online)")
    p.add_argument("--online-loads", default="0.4,0.7,0.9", help="fractions of the offline nondet request rate")
    p.add_argument("--online-num-requests", type=int, default=None, help="default: 500 on cuda, 8 on cpu")
    p.add_argument("--steady-batch", type=int, default=None, help="default: 256 on cuda, 8 on cpu")
    p.add_argument("--steady-steps", type=int, default=None, help="default: 128 on cuda, 4 on cpu")
    p.add_argument("--phases", default=",".join(PHASES),
                   help=f"the phases to run, the budget shared among them ({','.join(PHASES)}; online needs offline)")
    p.add_argument("--no-hf", action="store_true", help="skip transformers' generate")
    p.add_argument("--hf-no-compile", action="store_true", help="run transformers' generate eagerly")
    p.add_argument("--hf-batch", type=int, default=None, help="default: 256 on cuda, 4 on cpu")
    p.add_argument("--hf-new-tokens", type=int, default=None, help="default: 256 on cuda, 8 on cpu")
    p.add_argument("--lm-head-std", type=float, default=None, help="random models' output-head std")
    return p.parse_args(argv)


def main(argv: list[str] | None = None, *, repo: Path | None = None) -> int:
    """0: every phase ran; 1: some run failed or the budget cut the run; 2: nothing could run."""
    repo = Path.cwd() if repo is None else repo
    args = parse_args(argv)
    if args.replot is not None:
        return replot(args.replot, "plot_serving")
    pick = OnDevice(args)
    model = pick(args.model, "8b", "tiny")
    try:
        config = ServingConfig(
            device=args.device, model=model, dtype=pick.dtype, budget_s=args.budget_s, window=args.window,
            group=args.group, max_num_seqs=pick(args.max_num_seqs, 256, 8), max_fast_tokens=args.max_fast_tokens,
            num_requests=pick(args.num_requests, 1000, 12), length_scale=pick(args.length_scale, 1.0, 1 / 16),
            prompts=args.prompts, offline_modes=names(args.modes), online_modes=names(args.online_modes),
            online_loads=_floats(args.online_loads), online_num_requests=pick(args.online_num_requests, 500, 8),
            steady_batch=pick(args.steady_batch, 256, 8), steady_steps=pick(args.steady_steps, 128, 4),
            steady_prompt_tokens=pick(None, 128, 16),
            hf_compare=not args.no_hf, hf_batch=pick(args.hf_batch, 256, 4),
            hf_prompt_tokens=pick(None, 128, 8), hf_new_tokens=pick(args.hf_new_tokens, 256, 8),
            hf_compile=not args.hf_no_compile, seed=args.seed, lm_head_std=args.lm_head_std,
            use_cuda_graphs=not args.no_cuda_graphs, canonical_attention=args.canonical_attention,
            canonical_gemm=args.canonical_gemm, canonical_tile_m=args.canonical_tile_m,
            fast_decode_kernel=args.fast_decode_kernel, max_canonical_tokens=args.max_canonical_tokens,
            canonical_stream=args.canonical_stream, draft_ahead=not args.no_draft_ahead,
            wide_verify=args.wide_verify, canonical_gemm_rows=args.canonical_gemm_rows, gc_freeze=args.gc_freeze,
            prompt_drafts=args.prompt_drafts, canonical_sms=args.canonical_sms,
            canonical_sms_max_rows=args.canonical_sms_max_rows, scheduler_order=args.order,
            scheduler_admission=args.admission, phases=names(args.phases),
        )
        out = args.out or repo / "benchmarks" / "results" / f"serving_{args.device}_{_model_stem(model)}.json"
        results = run_serving(config, out=out, repo=repo, cache_dir=args.cache_dir)
    except (RuntimeError, ValueError, OSError) as exc:
        print(f"serving: {exc}", file=sys.stderr)
        return 2
    return finish(results, out, no_plots=args.no_plots, plotter="plot_serving", report=report(results))


def _model_stem(model: str) -> str:
    from llm42.bench.models import model_label

    path = Path(model)
    return model_label(path) if path.exists() else model


def report(results: dict) -> str:
    """A short plain-text table of the headline figures."""
    lines = [results["label"]]
    for label, s in (results.get("steady_decode") or {}).items():
        lines.append(f"steady decode B={s['batch']} ({label}): {s.get('wall_ms_per_step', float('nan')):.3f} ms/step "
                     f"wall, replay {_num(s.get('graph_replay_ms'))} ms, wall/kernel {_num(s.get('wall_over_kernel'))}")
    offline = results.get("offline") or {}
    if offline:
        bound = offline["roofline"]
        lines.append(f"offline, {offline['workload']['num_requests']} requests (roofline "
                     f"{bound['output_tokens_per_s']:,.0f} tok/s; GEMMs then attention, one after the other: "
                     f"{bound['serial_output_tokens_per_s']:,.0f}):")
        for name, s in offline["modes"].items():
            lat = s["latency_nondeterministic"]
            lines.append(f"  {name:16s} {s['output_tokens_per_s']:10,.0f} tok/s  x{_num(s['ratio_to_nondet'])}  "
                         f"{_num(s['engine']['ms_per_step'])} ms/step  free ITL p50/p99 "
                         f"{_num(_ms(lat['itl_s']['p50']))}/{_num(_ms(lat['itl_s']['p99']))} ms"
                         + ("" if s["is_complete"] else "  (cut)"))
    hf = (results.get("transformers") or {})
    if "hf" in hf:
        lines.append(f"transformers generate: {_num((hf['hf'] or {}).get('output_tokens_per_s'))} tok/s; llm42 "
                     f"{_num((hf.get('llm42') or {}).get('output_tokens_per_s'))} tok/s; ratio "
                     f"{_num(hf.get('llm42_over_hf'))}")
    for load, entry in ((results.get("online") or {}).get("loads") or {}).items():
        for name, s in entry["modes"].items():
            versus = s.get("free_itl_vs_nondet") or {}
            lines.append(f"online load {load} {name:16s} {s['output_tokens_per_s']:10,.0f} tok/s  free ITL "
                         f"p50/p99 vs nondet {_num(versus.get('p50_ratio'))}/{_num(versus.get('p99_ratio'))}")
    if results.get("errors"):
        lines.append(f"errors: {sorted(results['errors'])}")
    return "\n".join(lines)


def _ms(seconds):
    return None if seconds is None else seconds * 1e3


def _num(value) -> str:
    return "-" if value is None else f"{value:.3f}"


__all__ = ["ServingConfig", "run_serving", "main", "prepare_checkpoint", "steady_decode", "serving_summary"]

