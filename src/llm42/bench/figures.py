"""The LLM-42 paper's figures on a real model (``benchmarks/paper_figures.py``), and on the 8B shape calibrated to it.

On the real model (SmolLM2-135M-Instruct on the H200; chat prompts through its
tokenizer and chat template):

- **flip rate**: the fast path's per-token flip rate, batched vs alone with the
  same prefix (``llm42.bench.flips``), greedy and sampled rows apart;
- **Fig. 6, consistent spans**: requests decoded greedily on the fast path in a
  batch of ``fig6_batch`` (with filler requests) and alone (batch 1). The
  *first span* is the number of tokens that match before the first divergence.
  The *second span* restarts both runs from the common prefix — the prompt
  plus the alone run's tokens up to and including the first divergent position
  — and counts the matching tokens until they diverge again. A request that
  never diverges within ``fig6_new_tokens`` is censored (counted apart);
- **Fig. 9, verification cost vs window**: ``dvr@100`` on the same requests at
  every window T in {8, 16, 32, 64, 128}, single (G = 1) and grouped (G = 8):
  recompute share (rejected candidates / committed tokens), rollbacks per
  request, throughput against ``nondet``, and the verification cost per
  committed token = canonical passes x the time of one pass at R = T x G (CUDA
  graph replay incl. staging, measured separately on windows at the requests'
  mean context) / committed tokens;
- **Fig. 10, throughput vs deterministic share**: offline ``nondet`` (0 %),
  ``dvr@10/25/50/100``, against ``batch_invariant`` and ``no_batching`` (a few
  requests served one at a time; its outputs are the reference the
  deterministic outputs are checked against).

On the 8B shape (random weights): the output head is ``std x N`` plus a logit
bias ``b x std x sqrt(H) x z`` (``HeadBasis``: N and z fixed seeded draws,
``std`` the model's default head scale), and ``b`` is chosen by bisection on
a log scale so that the 8B shape's flip rate (measured the same way, on
random-id prompts) matches the real model's; then Fig. 10 (and Fig. 9 when
the budget allows) run on the calibrated model, and Fig. 10 again with the
default head (``DEFAULT_LM_HEAD_STD``, no bias), labelled *worst case*. The
head's scale alone cannot calibrate (it scales the logits' gaps and their
drift alike, so a greedy row's flip rate does not move; round 2's search over
it did not bracket the real rate); the bias, added exactly, widens the gaps
and not the drift. The JSON records every tried scale and whether the target
was bracketed, and says so when it was not.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from llm42.bench.devicetime import Budget, synchronize
from llm42.bench.flips import flip_rate
from llm42.bench.metrics import RunResult, percentile, summarize
from llm42.bench.models import DEFAULT_LM_HEAD_STD, BenchModel, build_model, model_label
from llm42.bench.modes import NO_BATCHING, deterministic_order, mode_by_name
from llm42.bench.passes import filled_kv, time_canonical_pass
from llm42.bench.runner import WARMUP_KV_TOKENS, Engine, capture_decode_graphs, run_offline
from llm42.bench.script import OnDevice, Run, add_common_args, finish, log, names, replot, run_meta
from llm42.bench.serving import prepare_checkpoint, probe_and_fit, run_modes
from llm42.bench.suite import device_info
from llm42.bench.workloads import FIRST_TOKEN_ID, Workload, chat_like, sharegpt_like
from llm42.generator import DVRGenerator
from llm42.params import SamplingParams

FIG9_WINDOWS = (8, 16, 32, 64, 128)
FIG9_GROUPS = (1, 8)
FIG10_MODES = ("nondet", "dvr@10", "dvr@25", "dvr@50", "dvr@100", "batch_invariant", "no_batching")
CALIBRATE_ON = ("mixed", "greedy", "sampled")


@dataclass(frozen=True)
class FiguresConfig:
    device: str
    model: str  # the real model: a .gguf or HF directory (or a random name for smoke runs)
    random_model: str | None  # "8b" (or "tiny" for smoke runs); None: no calibrated figures
    dtype: torch.dtype
    budget_s: float
    window: int = 32
    group: int = 8
    length_scale: float = 1.0
    fig6_measured: int = 32
    fig6_batch: int = 256
    fig6_new_tokens: int = 256
    fig9_requests: int = 64
    fig10_requests: int = 256
    no_batching_requests: int = 4
    flip_rows: int = 256
    flip_alone: int = 32
    flip_steps: int = 32
    calibrate_on: str = "mixed"
    calibrate_range: tuple[float, float] = (1.0, 16.0)  # the head's logit-bias scale (HeadBasis)
    calibrate_extensions: int = 2
    calibrate_iterations: int = 4
    fig9_windows: tuple[int, ...] = FIG9_WINDOWS
    fig9_groups: tuple[int, ...] = FIG9_GROUPS
    real_figures: tuple[str, ...] = ("6", "9", "10")
    random_figures: tuple[str, ...] = ("10", "9")
    worst_case: bool = True
    seed: int = 0
    use_cuda_graphs: bool = True
    canonical_attention: str = "tiled"
    canonical_gemm: str = "cublas"
    canonical_tile_m: int = 64

    def __post_init__(self) -> None:
        if self.calibrate_on not in CALIBRATE_ON:
            raise ValueError(f"calibrate_on must be one of {CALIBRATE_ON}, got {self.calibrate_on!r}")
        for figures in (self.real_figures, self.random_figures):
            if set(figures) - {"6", "9", "10"}:
                raise ValueError(f"figures are 6, 9 and 10, got {figures}")
        lo, hi = self.calibrate_range
        if not 0 < lo < hi:
            raise ValueError(f"calibrate_range must be 0 < lo < hi, got {self.calibrate_range}")
        if self.calibrate_extensions < 0 or self.calibrate_iterations < 0:
            raise ValueError("calibrate_extensions and calibrate_iterations must be >= 0, got "
                             f"{self.calibrate_extensions} and {self.calibrate_iterations}")


def _max_positions(config: FiguresConfig) -> int:
    sizing = sharegpt_like(max(config.fig10_requests, config.fig6_batch), length_scale=config.length_scale,
                           vocab_size=FIRST_TOKEN_ID + 1, seed=config.seed)
    longest_prompt = max(len(r.prompt) for r in sizing.requests) + 64
    need = max(sizing.max_total_tokens + 64, longest_prompt + 2 * config.fig6_new_tokens + 8)
    return -(-need // 256) * 256


def _workload(model: BenchModel, num: int, config: FiguresConfig) -> Workload:
    if model.tokenizer is not None:
        return chat_like(num, tokenizer=model.tokenizer, length_scale=config.length_scale,
                         vocab_size=model.cfg.vocab_size, seed=config.seed)
    return sharegpt_like(num, length_scale=config.length_scale, vocab_size=model.cfg.vocab_size, seed=config.seed)


# -- Fig. 6 -----------------------------------------------------------------------------------------

def first_mismatch(a: list[int], b: list[int]) -> int | None:
    """Index of the first position where ``a`` and ``b`` differ (None if one is a prefix of the other)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None


def _span_stats(spans: list[int | None], horizon: int) -> dict:
    diverged = [s for s in spans if s is not None]
    return {"num_measured": len(spans), "num_diverged": len(diverged), "num_censored": len(spans) - len(diverged),
            "horizon_tokens": horizon, "spans": spans,
            "median": percentile(diverged, 50), "p10": percentile(diverged, 10), "p90": percentile(diverged, 90),
            "mean": sum(diverged) / len(diverged) if diverged else None}


def consistent_spans(model: BenchModel, workload: Workload, config: FiguresConfig, deadline: float) -> dict:
    """Fig. 6: first and second consistent spans of the fast path, batched (``fig6_batch``) vs alone."""
    new_tokens = config.fig6_new_tokens
    batch = min(config.fig6_batch, workload.num_requests)
    num_measured = min(config.fig6_measured, batch)
    prompts = [list(r.prompt) for r in workload.requests[:batch]]
    measured = [round(i * batch / num_measured) for i in range(num_measured)]  # spread through the batch
    room = sum(sorted((len(p) for p in prompts), reverse=True)[:batch]) + batch * (2 * new_tokens + 8)
    gen = DVRGenerator(model.weights, model.cfg, window=config.window, group=config.group, max_num_seqs=batch,
                       kv_cache_tokens=room + WARMUP_KV_TOKENS, use_cuda_graphs=config.use_cuda_graphs)
    notes = capture_decode_graphs(gen) if gen.fast_step.decode_graphs is not None else []
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)  # greedy, fast path only
    started = time.perf_counter()
    round_deadline = started + 0.6 * max(0.0, deadline - started)

    def batched_then_alone(items: list[list[int]], slots: list[int], until: float) -> tuple[list, list]:
        batch_prompts = list(prompts)
        for slot, prompt in zip(slots, items):
            batch_prompts[slot] = prompt
        outs = gen.generate(batch_prompts, params)
        together = [list(outs[s].token_ids) for s in slots]
        alone = []
        for prompt in items:
            if time.perf_counter() > until:
                break
            alone.append(list(gen.generate([prompt], params)[0].token_ids))
        return together, alone

    together, alone = batched_then_alone([prompts[i] for i in measured], measured, round_deadline)
    first = [first_mismatch(t, a) for t, a in zip(together, alone)]
    diverged = [(i, s) for i, s in zip(measured, first) if s is not None]
    second: list[int | None] = []
    if diverged and time.perf_counter() < deadline:
        extended = [prompts[i] + alone[measured.index(i)][: s + 1] for i, s in diverged]
        together2, alone2 = batched_then_alone(extended, [i for i, _ in diverged], deadline)
        second = [first_mismatch(t, a) for t, a in zip(together2, alone2)]
    num_compared = sum(new_tokens if s is None else s + 1 for s in first) + sum(
        new_tokens if s is None else s + 1 for s in second)
    num_flips = sum(s is not None for s in first) + sum(s is not None for s in second)
    return {
        "batch": batch, "new_tokens": new_tokens, "measured_requests": measured[: len(alone)], "notes": notes,
        "first_span": _span_stats(first, new_tokens), "second_span": _span_stats(second, new_tokens),
        "flip_rate_from_spans": num_flips / num_compared if num_compared else None,
        "elapsed_s": time.perf_counter() - started,
    }


# -- Fig. 9 -----------------------------------------------------------------------------------------

def window_sweep(run: Run, model: BenchModel, workload: Workload, config: FiguresConfig, deadline: float,
                 entry: dict) -> None:
    """Fig. 9: dvr@100 at every (T, G), each point with its recompute share and verification cost per token."""
    device = model.weights.device
    num_points = len(config.fig9_windows) * len(config.fig9_groups)
    kv_tokens = workload.num_kv_tokens + WARMUP_KV_TOKENS
    det_order = deterministic_order(workload.num_requests, seed=config.seed)
    start, span = time.perf_counter(), max(0.0, deadline - time.perf_counter())
    engine = Engine(model, config.window, config.group, kv_tokens, max_num_seqs=workload.num_requests,
                    use_cuda_graphs=config.use_cuda_graphs, canonical_attention=config.canonical_attention,
                    canonical_gemm=config.canonical_gemm, canonical_tile_m=config.canonical_tile_m)
    entry.update(workload=workload.summary(), mode="dvr@100", points=[])
    log("fig 9 nondet")
    nondet = run.guarded("fig9 nondet", lambda: run_offline(engine, workload, mode_by_name("nondet"),
                                                           det_order=det_order, deadline=start + span / 6))
    if nondet is not None:
        entry["nondet_output_tokens_per_s"] = nondet.tokens_per_s
    context = round(sum(len(r.prompt) + r.max_new_tokens / 2 for r in workload.requests) / workload.num_requests)
    dvr = mode_by_name("dvr@100")
    k = 0
    for window in config.fig9_windows:
        for group in config.fig9_groups:
            k += 1
            point_deadline = start + span * (1 / 6 + 5 / 6 * k / num_points)
            if time.perf_counter() > point_deadline:
                entry.setdefault("skipped", []).append(f"T={window} G={group}")
                continue
            log(f"fig 9 T={window} G={group}")
            result = run.guarded(f"fig9 T={window} G={group}", lambda w=window, g=group, d=point_deadline: (
                run_offline(engine, workload, dvr, det_order=det_order, deadline=d, window=w, group=g)))
            if result is None:
                continue
            pass_time = run.guarded(f"fig9 pass T={window} G={group}", lambda w=window, g=group: _pass_ms(
                model, window=w, group=g, context=max(context, w), use_cuda_graphs=config.use_cuda_graphs))
            summary = summarize(result, nondet=nondet)
            passes = result.stats.get("canonical_passes", 0)
            committed = summary["output_tokens"]
            entry["points"].append({
                "window": window, "group": group, "rows": window * group, "is_complete": result.is_complete,
                "output_tokens_per_s": summary["output_tokens_per_s"], "ratio_to_nondet": summary["ratio_to_nondet"],
                "recompute_share": summary["recompute_share"],
                "rollbacks_per_request": summary["rollbacks_per_request"], "canonical_passes": passes,
                "canonical_row_utilization": summary["engine"]["canonical_row_utilization"],
                "committed_tokens": committed, "pass_ms": pass_time,
                "verify_ms_per_committed_token": (passes * pass_time / committed
                                                  if pass_time is not None and committed else None),
            })
            run.save()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _pass_ms(model: BenchModel, *, window: int, group: int, context: int, use_cuda_graphs: bool) -> float:
    kv = filled_kv(model.cfg, model.weights, num_seqs=group, context=context, extra=8,
                   num_scratch_slots=window * group)
    timed = time_canonical_pass(model.weights, model.cfg, kv, window=window, group=group, context=context,
                                use_cuda_graphs=use_cuda_graphs, reps=5, variants=("greedy",))
    del kv
    return timed.get("graph_pass_ms") or timed["eager_pass_ms"]


# -- Fig. 10 ----------------------------------------------------------------------------------------

def share_sweep(run: Run, model: BenchModel, full: Workload, config: FiguresConfig, deadline: float,
                entry: dict) -> None:
    """Fig. 10: offline throughput at deterministic shares 0-100 %, against batch_invariant and no_batching."""
    det_order = deterministic_order(full.num_requests, seed=config.seed)
    max_num_seqs = min(256, full.num_requests)
    totals = sorted((len(r.prompt) + r.max_new_tokens for r in full.requests), reverse=True)
    engine = Engine(model, config.window, config.group, sum(totals[:max_num_seqs]) + WARMUP_KV_TOKENS,
                    max_num_seqs=max_num_seqs, use_cuda_graphs=config.use_cuda_graphs,
                    canonical_attention=config.canonical_attention, canonical_gemm=config.canonical_gemm,
                    canonical_tile_m=config.canonical_tile_m)
    workload, probe, probe_info = probe_and_fit(run, engine, full, FIG10_MODES[:-1], det_order=det_order,
                                                deadline=deadline, probe_size=max_num_seqs)
    if not probe_info:
        return
    entry.update(workload=workload.summary(), probe=probe_info, modes={})
    # no_batching runs first (few requests, alone): its outputs are the reference the dvr modes are checked on
    reference_run = run.guarded("fig10 no_batching", lambda: run_offline(
        engine, workload, NO_BATCHING, det_order=det_order, deadline=time.perf_counter() + 0.15 * max(
            0.0, deadline - time.perf_counter()), max_requests=config.no_batching_requests))
    reference = None
    if reference_run is not None:
        reference = {r.index: r.token_ids for r in reference_run.records if r.is_finished}

    def summary(result: RunResult, runs: dict[str, RunResult]) -> dict:
        return summarize(result, nondet=runs.get("nondet"), reference=reference)

    runs = run_modes(run, engine, workload, FIG10_MODES[:-1], det_order=det_order, deadline=deadline, entry=entry,
                     label="fig10", reuse={"nondet": probe} if probe is not None else None, summary=summary)
    if reference_run is not None:
        entry["modes"]["no_batching"] = summarize(reference_run, nondet=runs.get("nondet"))
    checked = [s["determinism"] for s in entry["modes"].values() if "determinism" in s]
    entry["determinism"] = {"reference": "no_batching", "num_checked": sum(c["num_checked"] for c in checked),
                            "num_identical": sum(c["num_identical"] for c in checked)}
    run.save()


# -- calibrating the 8B head ------------------------------------------------------------------------

@dataclass(frozen=True)
class HeadBasis:
    """The fixed draws a calibrated output head is built from: weight ``std x N``, logit bias ``b x std x sqrt(H) x z``.

    N [V, H] and z [V] are seeded standard normals; ``std x sqrt(H)`` is the
    spread of the weight's logits ``N h`` for a final hidden state h (|h| is
    about sqrt(H) after the final RMSNorm), so ``b`` (``bias_scale``) is the
    bias's spread in units of it. The fast path's drift moves ``N h`` only (the
    bias is added exactly, the same in every batch), so a larger ``b`` widens
    the gap between a row's winner and its runner-up without widening the drift:
    fewer flips, as in a trained model's peaked logits, down to none. Scaling the
    weight alone cannot do this (it scales the gaps and the drift alike, so a
    greedy row's flips do not move: round 2's search over ``std`` never
    reached the real model's rate).
    """

    noise: torch.Tensor  # N, float32
    direction: torch.Tensor  # sqrt(H) z, float32
    std: float

    @classmethod
    def draw(cls, cfg, device: torch.device, *, std: float, seed: int) -> HeadBasis:
        generator = torch.Generator(device=device).manual_seed(seed + 4242)
        noise = torch.randn(cfg.vocab_size, cfg.hidden_size, generator=generator, device=device)
        z = torch.randn(cfg.vocab_size, generator=generator, device=device)
        return cls(noise, z * math.sqrt(cfg.hidden_size), std)

    def head(self, bias_scale: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(weight, bias) in ``dtype``; no bias at ``bias_scale`` 0."""
        bias = (self.direction * (bias_scale * self.std)).to(dtype) if bias_scale else None
        return (self.noise * self.std).to(dtype), bias


def with_head(model: BenchModel, basis: HeadBasis, bias_scale: float) -> BenchModel:
    """``model`` with the output head ``basis`` gives at ``bias_scale`` (a calibration's chosen point)."""
    weight, bias = basis.head(bias_scale, model.weights.dtype)
    return dataclasses.replace(
        model, weights=dataclasses.replace(model.weights, lm_head=weight, lm_head_bias=bias), lm_head_std=basis.std,
        lm_head_bias_scale=bias_scale,
        description=f"{model.description}; output head {basis.std:.4g} x N, logit bias {bias_scale:.4g} x "
                    f"{basis.std:.4g} x sqrt(H) x z (fixed seeded N, z)")


def calibrate_head(model: BenchModel, prompts: list[tuple[int, ...]], target: float, config: FiguresConfig,
                   deadline: float) -> tuple[BenchModel, dict]:
    """Bisect the head's bias scale (``HeadBasis``) on a log scale until the flip rate (``calibrate_on``) matches ``target``.

    The range's two ends are measured first; while both rates lie on the same
    side of the target the range is extended outwards by 4x on that side (at
    most ``calibrate_extensions`` times), then bisected. Every tried scale is
    recorded with its rates; ``is_bracketed`` says whether the target was
    reached between two measured points.
    """
    cfg, device = model.cfg, model.weights.device
    std = model.lm_head_std if model.lm_head_std is not None else 0.02
    basis = HeadBasis.draw(cfg, device, std=std, seed=config.seed)
    num_evals = 2 + config.calibrate_extensions + config.calibrate_iterations
    tried = []

    def rate_at(scale: float) -> float | None:
        each = max(0.0, deadline - time.perf_counter()) / max(1, num_evals - len(tried))
        got = flip_rate(with_head(model, basis, scale).weights, cfg, prompts, num_steps=config.flip_steps,
                        num_alone=config.flip_alone, seed=config.seed, use_cuda_graphs=config.use_cuda_graphs,
                        deadline=time.perf_counter() + each, min_steps=min(8, config.flip_steps))
        _release(device)  # the probe's K/V store and graphs, before the next head is built
        value = got["rate"] if config.calibrate_on == "mixed" else got[config.calibrate_on]["rate"]
        tried.append({"lm_head_bias_scale": scale, "rate": value, "measured": got})
        log(f"calibration: bias scale {scale:.4g} -> {config.calibrate_on} flip rate {value}")
        return value

    lo, hi = config.calibrate_range
    result = {"target_rate": target, "calibrate_on": config.calibrate_on, "lm_head_std": std,
              "range": [lo, hi], "tried": tried}
    r_lo, r_hi = rate_at(lo), rate_at(hi)
    for _ in range(config.calibrate_extensions):
        if r_lo is None or r_hi is None or min(r_lo, r_hi) <= target <= max(r_lo, r_hi):
            break
        if time.perf_counter() > deadline:
            break
        # extend on the side whose rate is nearer the target
        if abs(r_hi - target) <= abs(r_lo - target):
            lo, r_lo, hi = hi, r_hi, hi * 4
            r_hi = rate_at(hi)
        else:
            hi, r_hi, lo = lo, r_lo, lo / 4
            r_lo = rate_at(lo)
    result["searched"] = [lo, hi]
    if r_lo is None or r_hi is None:
        result["is_bracketed"] = False
    elif not min(r_lo, r_hi) <= target <= max(r_lo, r_hi):
        result["is_bracketed"] = False
        result["note"] = ("the target rate lies outside the rates measured over the searched range: the closest "
                          "point was chosen and the calibrated figures do not reproduce the real model's flip rate")
    else:
        result["is_bracketed"] = True
        is_increasing = r_hi >= r_lo
        for _ in range(config.calibrate_iterations):
            if time.perf_counter() > deadline:
                break
            mid = math.sqrt(lo * hi)
            r_mid = rate_at(mid)
            if r_mid is None:
                break
            if (r_mid < target) == is_increasing:
                lo = mid
            else:
                hi = mid
    measured = [t for t in tried if t["rate"] is not None]
    chosen = min(measured, key=lambda t: abs(t["rate"] - target))["lm_head_bias_scale"] if measured else hi
    result["chosen_lm_head_bias_scale"] = chosen
    result["achieved_rate"] = next((t["rate"] for t in tried if t["lm_head_bias_scale"] == chosen), None)
    calibrated = with_head(model, basis, chosen)
    del basis
    return calibrated, result


# -- the whole run ----------------------------------------------------------------------------------

def _figures_for(run: Run, model: BenchModel, figures: tuple[str, ...], config: FiguresConfig, deadline: float,
                 section: dict, *, with_fig6: bool) -> None:
    shares = {"6": 0.3, "9": 0.35, "10": 0.35}
    chosen = [f for f in ("6", "10", "9") if f in figures and (f != "6" or with_fig6)]
    total = sum(shares[f] for f in chosen) or 1.0
    start, span = time.perf_counter(), max(0.0, deadline - time.perf_counter())
    cumulative = 0.0
    for fig in chosen:
        cumulative += shares[fig] / total
        fig_deadline = start + cumulative * span
        if time.perf_counter() > fig_deadline:
            section.setdefault("skipped", []).append(f"fig{fig}")
            continue
        if fig == "6":
            workload = _workload(model, max(config.fig6_batch, config.fig6_measured), config)
            got = run.guarded(f"{section['label']} fig6", lambda w=workload, d=fig_deadline: consistent_spans(
                model, w, config, d))
            if got is not None:
                section["fig6"] = got
        elif fig == "9":
            section["fig9"] = {}
            window_sweep(run, model, _workload(model, config.fig9_requests, config), config, fig_deadline,
                         section["fig9"])
        else:
            section["fig10"] = {}
            share_sweep(run, model, _workload(model, config.fig10_requests, config), config, fig_deadline,
                        section["fig10"])
        run.save()


def run_figures(config: FiguresConfig, *, out: Path, repo: Path, cache_dir: Path | None = None) -> dict:
    budget = Budget(config.budget_s)
    device = torch.device(config.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda was asked for but torch sees no CUDA device")
    max_positions = _max_positions(config)
    real = build_model(prepare_checkpoint(config.model, cache_dir), device=device, dtype=config.dtype,
                       max_positions=max_positions, seed=config.seed, with_tokenizer=True)
    results = {
        "label": f"{device_info(device)['name']}, real model {real.name} ({real.summary()['dtype']})"
                 + ("" if device.type == "cuda" else " — CPU smoke run, NOT representative"),
        "meta": run_meta(config, device, repo),
        "real": {"label": "real", "model": real.summary(), "prompts": "chat" if real.tokenizer else "random ids"},
        "random": None,
    }
    run = Run(config, out, budget, results)
    with run.until_done():
        # with no real-model figures asked for (--real-figures ''), only its flip rate: the calibration's target
        real_share = (0.5 if config.real_figures else 0.12) if config.random_model else 1.0
        real_deadline = budget.phase(real_share)
        flip_share = 0.15 if config.real_figures else 1.0
        flip_deadline = time.perf_counter() + flip_share * max(0.0, real_deadline - time.perf_counter())
        flip_prompts = [r.prompt for r in _workload(real, config.flip_rows, config).requests]
        log("real model: flip rate")
        real_flips = run.guarded("real flip rate", lambda: flip_rate(
            real.weights, real.cfg, flip_prompts, num_steps=config.flip_steps, num_alone=config.flip_alone,
            seed=config.seed, use_cuda_graphs=config.use_cuda_graphs, deadline=flip_deadline))
        results["real"]["flip_rate"] = real_flips
        run.save()
        _figures_for(run, real, config.real_figures, config, real_deadline, results["real"], with_fig6=True)
        del real
        _release(device)
        if config.random_model:
            _random_model_figures(run, config, device, max_positions, real_flips, share=1.0 - real_share)
    return results


def _random_model_figures(run: Run, config: FiguresConfig, device: torch.device, max_positions: int,
                          real_flips: dict | None, *, share: float) -> None:
    """Calibrate the random model's head to the real model's flip rate, then its figures, then the worst case.

    ``share``: the budget's share left for all of it (calibration 36 % of it, the worst case 16 %).
    """
    budget = run.budget
    run.results["random"] = section = {"label": "random", "name": config.random_model}
    base = build_model(config.random_model, device=device, dtype=config.dtype, max_positions=max_positions,
                       seed=config.seed)
    section["model"] = base.summary()
    calibration_share, worst_share = 0.36 * share, (0.16 * share if config.worst_case else 0.0)
    calibration_deadline = budget.phase(calibration_share)
    target = None
    if real_flips is not None:
        target = real_flips["rate"] if config.calibrate_on == "mixed" else real_flips[config.calibrate_on]["rate"]
    calibrated = None
    if target is not None:
        random_prompts = [r.prompt for r in _workload(base, config.flip_rows, config).requests]
        log(f"calibrating {config.random_model}'s head to flip rate {target}")
        got = run.guarded("calibration", lambda: calibrate_head(base, random_prompts, target, config,
                                                                calibration_deadline))
        if got is not None:
            calibrated, section["calibration"] = got
    else:
        section["calibration"] = {"skipped": "the real model's flip rate was not measured"}
    run.save()
    if calibrated is not None:
        section["calibrated"] = {"label": "calibrated", "lm_head_std": calibrated.lm_head_std,
                                 "lm_head_bias_scale": calibrated.lm_head_bias_scale}
        _figures_for(run, calibrated, config.random_figures, config, budget.phase(share - calibration_share - worst_share),
                     section["calibrated"], with_fig6=False)
        del calibrated
        _release(device)
    if config.worst_case:
        std = DEFAULT_LM_HEAD_STD.get(config.random_model)
        worst = dataclasses.replace(base, lm_head_std=std) if std is None else build_model(
            config.random_model, device=device, dtype=config.dtype, max_positions=max_positions, seed=config.seed,
            lm_head_std=std)
        del base
        _release(device)
        section["worst_case"] = {"label": "worst_case", "lm_head_std": std,
                                 "note": "uncalibrated random head: an upper bound on rollback cost, not a prediction"}
        _figures_for(run, worst, ("10",), config, budget.phase(1.0), section["worst_case"], with_fig6=False)


def _release(device: torch.device) -> None:
    import gc

    if device.type == "cuda":
        gc.collect()
        synchronize(device)
        torch.cuda.empty_cache()


# -- command line -----------------------------------------------------------------------------------

USAGE = """examples:
  one H200: SmolLM2 (a .gguf or HF directory), then the 8B shape calibrated to it:
    PYTHONPATH=src python3 benchmarks/paper_figures.py --device cuda \\
        --model /root/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf --random-model 8b --budget-s 480
  CPU smoke run (tiny random models in both roles, seconds):
    PYTHONPATH=src python3 benchmarks/paper_figures.py --device cpu --model tiny --random-model tiny --budget-s 30
  redraw the plots of a saved run:
    PYTHONPATH=src python3 benchmarks/paper_figures.py --replot benchmarks/results/paper_figures_cuda_smollm2.json
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="The LLM-42 paper's Fig. 6, 9 and 10 on a real model and on the 8B "
                                "shape calibrated to its flip rate (docs/benchmarks.md).", epilog=USAGE,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p, budget_s=480.0,
                    out_help="results JSON (default: benchmarks/results/paper_figures_<device>_<model>.json)")
    p.add_argument("--model", default=None, help="the real model: a .gguf file or HF directory (tiny on cpu)")
    p.add_argument("--random-model", default=None, help="random-weight model to calibrate: 8b (tiny on cpu); "
                   "'none' skips it (default: 8b on cuda, tiny on cpu)")
    p.add_argument("--length-scale", type=float, default=None, help="default: 1 on cuda, 1/16 on cpu")
    p.add_argument("--real-figures", default="6,9,10")
    p.add_argument("--random-figures", default="10,9")
    p.add_argument("--no-worst-case", action="store_true", help="skip the uncalibrated 8B figures")
    p.add_argument("--calibrate-on", choices=CALIBRATE_ON, default="mixed")
    p.add_argument("--calibrate-range", default="1,16", help="the output head's logit-bias scale: the range "
                   "searched (log-scale bisection, extended 4x outwards up to twice when it does not bracket)")
    for name in ("fig6-measured", "fig6-batch", "fig6-new-tokens", "fig9-requests", "fig10-requests", "flip-rows",
                 "flip-alone", "flip-steps"):
        p.add_argument(f"--{name}", type=int, default=None)
    p.add_argument("--fig9-windows", default=",".join(map(str, FIG9_WINDOWS)))
    p.add_argument("--fig9-groups", default=",".join(map(str, FIG9_GROUPS)))
    return p.parse_args(argv)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def main(argv: list[str] | None = None, *, repo: Path | None = None) -> int:
    repo = Path.cwd() if repo is None else repo
    args = parse_args(argv)
    if args.replot is not None:
        return replot(args.replot, "plot_figures")
    pick = OnDevice(args)
    model = pick(args.model, None, "tiny")
    if model is None:
        print("paper_figures: --model PATH (the real model) is needed on cuda", file=sys.stderr)
        return 2
    random_model = pick(args.random_model, "8b", "tiny")
    try:
        lo, hi = (float(x) for x in args.calibrate_range.split(","))
        config = FiguresConfig(
            device=args.device, model=model, random_model=None if random_model == "none" else random_model,
            dtype=pick.dtype, budget_s=args.budget_s, window=args.window, group=args.group,
            length_scale=pick(args.length_scale, 1.0, 1 / 16),
            fig6_measured=pick(args.fig6_measured, 32, 3), fig6_batch=pick(args.fig6_batch, 256, 6),
            fig6_new_tokens=pick(args.fig6_new_tokens, 256, 12), fig9_requests=pick(args.fig9_requests, 64, 3),
            fig9_windows=_ints(args.fig9_windows), fig9_groups=_ints(args.fig9_groups),
            fig10_requests=pick(args.fig10_requests, 256, 6), no_batching_requests=pick(None, 4, 2),
            flip_rows=pick(args.flip_rows, 256, 6), flip_alone=pick(args.flip_alone, 32, 2),
            flip_steps=pick(args.flip_steps, 32, 3), calibrate_on=args.calibrate_on, calibrate_range=(lo, hi),
            calibrate_iterations=pick(None, 4, 1),
            calibrate_extensions=pick(None, 2, 0), real_figures=names(args.real_figures),
            random_figures=names(args.random_figures), worst_case=not args.no_worst_case, seed=args.seed,
            use_cuda_graphs=not args.no_cuda_graphs, canonical_attention=args.canonical_attention,
            canonical_gemm=args.canonical_gemm, canonical_tile_m=args.canonical_tile_m,
        )
        stem = model_label(Path(model)) if Path(model).exists() else model
        out = args.out or repo / "benchmarks" / "results" / f"paper_figures_{args.device}_{stem}.json"
        results = run_figures(config, out=out, repo=repo, cache_dir=args.cache_dir)
    except (RuntimeError, ValueError, OSError) as exc:
        print(f"paper_figures: {exc}", file=sys.stderr)
        return 2
    return finish(results, out, no_plots=args.no_plots, plotter="plot_figures", report=report(results))


def report(results: dict) -> str:
    lines = [results["label"]]
    sections = [results["real"]]
    random = results.get("random") or {}
    sections += [random[k] for k in ("calibrated", "worst_case") if k in random]
    flips = results["real"].get("flip_rate") or {}
    if flips:
        lines.append(f"real flip rate: {flips.get('rate')} (greedy {flips['greedy']['rate']}, sampled "
                     f"{flips['sampled']['rate']}, {flips['num_compared']} tokens compared)")
    calibration = random.get("calibration") or {}
    if "chosen_lm_head_bias_scale" in calibration:
        lines.append(f"calibration: lm_head_bias_scale {calibration['chosen_lm_head_bias_scale']:.4g} -> rate "
                     f"{calibration['achieved_rate']} (target {calibration['target_rate']}, bracketed "
                     f"{calibration['is_bracketed']})")
    for section in sections:
        fig6 = section.get("fig6")
        if fig6:
            f, s = fig6["first_span"], fig6["second_span"]
            lines.append(f"[{section['label']}] fig6: first span median {f['median']} ({f['num_diverged']}/"
                         f"{f['num_measured']} diverged), second span median {s['median']} ({s['num_diverged']}/"
                         f"{s['num_measured']})")
        for p in (section.get("fig9") or {}).get("points", []):
            lines.append(f"[{section['label']}] fig9 T={p['window']:3d} G={p['group']}: recompute "
                         f"{p['recompute_share']:.3f}  verify {p['verify_ms_per_committed_token']} ms/token  "
                         f"x{p['ratio_to_nondet']}")
        for name, s in ((section.get("fig10") or {}).get("modes") or {}).items():
            lines.append(f"[{section['label']}] fig10 {name:16s} {s['output_tokens_per_s']:10.1f} tok/s  "
                         f"x{s['ratio_to_nondet']}")
    if results.get("errors"):
        lines.append(f"errors: {sorted(results['errors'])}")
    return "\n".join(lines)


__all__ = ["FiguresConfig", "run_figures", "main", "consistent_spans", "window_sweep", "share_sweep",
           "calibrate_head", "first_mismatch"]
