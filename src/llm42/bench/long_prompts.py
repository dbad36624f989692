"""Long prompts: time to first token against the prefill roofline, and free requests' gaps while one arrives.

Run from the repository root: ``python -m llm42.bench.long_prompts --help``.

One model per run, in this order, each phase ending by its share of ``--budget-s``:

1. **ceilings**: copy bandwidth and GEMM rate, measured now (``devicetime``).
2. **TTFT**: one request alone (``max_new_tokens = 1``) per prompt length in
   ``--lengths``, free and deterministic, median of ``--reps`` runs (each on new
   random tokens, so the prefix cache never serves one from another). The
   prefill's roofline is its matrix FLOPs (2 x matrix parameters per token, the
   head once) plus causal attention (4 x layers x heads x head_dim x n(n+1)/2) at
   the measured GEMM rate; ``ttft_over_roofline`` is what the issue's target
   (<= 1.5 at 8,192 and 15,000 tokens) is about.
3. **ITL under a long arrival**: ``--free-batch`` free requests decode; the gaps
   between each one's committed tokens are recorded while nothing else arrives
   (``baseline``), then from the submission of one ``--itl-prompt``-token prompt
   to its first token, once free and once deterministic. ``det_over_free`` is
   the ratio of the gaps' p50 (the issue's target: <= 1.3).

A step's wall time is host time (``gen.step()`` reads its tokens back a step
late, so nothing here synchronises beyond what the engine does). Results are
rewritten to ``--out`` after every phase.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from llm42.bench.devicetime import Budget, measure_ceilings, synchronize
from llm42.bench.metrics import percentile
from llm42.bench.models import BenchModel, build_model, model_label
from llm42.bench.roofline import model_sizes
from llm42.bench.runner import capture_mixed_graphs, capture_prefill_graphs
from llm42.bench.script import OnDevice, Run, add_common_args, canonical_key_chunk, finish, log, run_meta
from llm42.generator import DVRGenerator
from llm42.params import SamplingParams
from llm42.policies import FastPolicy, FixedShapePolicy


@dataclass(frozen=True)
class LongPromptConfig:
    device: str
    model: str
    dtype: torch.dtype
    budget_s: float
    window: int
    group: int
    lengths: tuple[int, ...]
    reps: int
    free_batch: int
    free_new_tokens: int
    itl_prompt: int
    itl_steps: int
    max_fast_tokens: int
    seed: int
    use_cuda_graphs: bool
    canonical_thread: bool = False
    canonical_attention: str = "tiled"
    canonical_gemm: str = "cublas"  # FixedShapePolicy(gemm=...)
    canonical_tile_m: int = 64  # FixedShapePolicy(tile_m=...)
    fast_decode_kernel: str = "split"
    max_canonical_tokens: int | None = None  # None: the engine's default (max_fast_tokens, in R-row steps)
    canonical_stream: bool | None = None  # CUDA: the canonical pass on its own stream (None: the engine's default)
    canonical_gemm_streams: int = 1  # CUDA: a wide pass's R-row GEMM blocks side by side on that many streams
    block_size: int = 16  # DVRGenerator(block_size=...): K/V page size (64, 128: attention reads pages by TMA)

    @property
    def max_positions(self) -> int:
        return max(*self.lengths, self.itl_prompt + self.free_new_tokens, 64) + 64


def prefill_roofline_s(model: BenchModel, num_tokens: int, matmul_TFLOPs: float) -> float:
    """The least time one prompt of ``num_tokens`` can be prefilled in at the measured GEMM rate."""
    cfg = model.cfg
    sizes = model_sizes(model.weights, cfg)
    attention = 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * num_tokens * (num_tokens + 1) / 2
    flops = 2 * sizes["layer_matrix_params"] * num_tokens + 2 * sizes["head_params"] + attention
    return flops / (matmul_TFLOPs * 1e12)


def _prompt(rng: random.Random, model: BenchModel, n: int) -> list[int]:
    return [rng.randrange(3, model.cfg.vocab_size) for _ in range(n)]


def first_token_s(gen: DVRGenerator, prompt: list[int], *, deterministic: bool) -> float:
    """Seconds from submitting ``prompt`` alone to its one committed token."""
    device = gen.device
    synchronize(device)
    start = time.perf_counter()
    rid = gen.submit(prompt, SamplingParams(max_new_tokens=1, ignore_eos=True, deterministic=deterministic))
    while not gen.is_finished(rid):
        gen.step()
    elapsed = time.perf_counter() - start
    gen.result(rid)
    return elapsed


def ttft_phase(run: Run, gen: DVRGenerator, model: BenchModel, config: LongPromptConfig, ceilings: dict,
               deadline: float) -> None:
    rng = random.Random(config.seed)
    rows = run.results["ttft"] = []
    for deterministic in (False, True):  # warm-up: graphs captured, kernels compiled
        first_token_s(gen, _prompt(rng, model, min(config.lengths)), deterministic=deterministic)
    for n in sorted(config.lengths):
        for deterministic in (False, True):
            if time.perf_counter() > deadline:
                run.results["ttft_cut_at"] = n
                return
            times = [first_token_s(gen, _prompt(rng, model, n), deterministic=deterministic)
                     for _ in range(config.reps)]
            ttft = sorted(times)[len(times) // 2]
            bound = prefill_roofline_s(model, n, ceilings["matmul_TFLOPs"])
            rows.append({"prompt_tokens": n, "deterministic": deterministic, "ttft_ms": ttft * 1e3,
                         "runs_ms": [t * 1e3 for t in times], "prefill_roofline_ms": bound * 1e3,
                         "ttft_over_roofline": ttft / bound if bound > 0 else None})
            log(f"TTFT {n} tokens, {'det' if deterministic else 'free'}: {ttft * 1e3:.1f} ms "
                f"({rows[-1]['ttft_over_roofline']:.2f}x the prefill roofline)")
            run.save()


def _gaps(gen: DVRGenerator, free: set[int], last: dict[int, float], *, until) -> list[float]:
    """Step until ``until(events)``; each free request's gaps (s) between steps that committed it tokens."""
    gaps = []
    while True:
        events = gen.step()
        now = time.perf_counter()
        for rid in free.intersection(events):
            if rid in last:
                gaps.append(now - last[rid])
            last[rid] = now
        if until(events):
            return gaps


def _gap_summary(gaps: list[float]) -> dict:
    ms = [g * 1e3 for g in gaps]
    return {"num_gaps": len(ms), "p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99)}


def itl_phase(run: Run, gen: DVRGenerator, model: BenchModel, config: LongPromptConfig) -> None:
    rng = random.Random(config.seed + 1)
    params = SamplingParams(max_new_tokens=config.free_new_tokens, ignore_eos=True)
    free = {gen.submit(_prompt(rng, model, 16), params) for _ in range(config.free_batch)}
    last: dict[int, float] = {}
    result = run.results["itl"] = {"free_batch": config.free_batch, "itl_prompt_tokens": config.itl_prompt}
    _gaps(gen, free, last, until=lambda _: len(last) == len(free))  # every free request decoding
    num_steps = [0]

    def after_steps(_events) -> bool:
        num_steps[0] += 1
        return num_steps[0] >= config.itl_steps

    result["baseline"] = _gap_summary(_gaps(gen, free, last, until=after_steps))
    for label, deterministic in (("free_prompt", False), ("det_prompt", True)):
        rid = gen.submit(_prompt(rng, model, config.itl_prompt),
                         SamplingParams(max_new_tokens=1, ignore_eos=True, deterministic=deterministic))
        start = time.perf_counter()
        gaps = _gaps(gen, free, last, until=lambda events, rid=rid: rid in events)
        result[label] = {**_gap_summary(gaps), "ttft_ms": (time.perf_counter() - start) * 1e3}
        gen.result(rid)
        log(f"free requests' gaps while a {config.itl_prompt}-token {label.split('_')[0]} prompt is admitted: "
            f"p50 {result[label]['p50_ms']:.2f} ms")
    free_p50, det_p50 = result["free_prompt"]["p50_ms"], result["det_prompt"]["p50_ms"]
    result["det_over_free"] = det_p50 / free_p50 if free_p50 else None
    for rid in free:  # their Completions handed over either way
        gen.result(rid) if gen.is_finished(rid) else gen.abort(rid)
    run.save()


def run_long_prompts(config: LongPromptConfig, *, out: Path, repo: Path) -> dict:
    device = torch.device(config.device)
    budget = Budget(config.budget_s)
    results = {"meta": run_meta(config, device, repo)}
    run = Run(config, out, budget, results)
    with run.until_done():
        results["ceilings"] = ceilings = measure_ceilings(device)
        model = build_model(config.model, device=device, dtype=config.dtype, max_positions=config.max_positions,
                            seed=config.seed)
        results["model"] = model.summary()
        kv_tokens = (config.free_batch * (16 + config.free_new_tokens) + 2 * config.max_positions)
        gen = DVRGenerator(model.weights, model.cfg, window=config.window, group=config.group,
                           max_num_seqs=config.free_batch + 2, max_fast_tokens=config.max_fast_tokens,
                           kv_cache_tokens=kv_tokens, max_model_len=config.max_positions,
                           use_cuda_graphs=config.use_cuda_graphs, canonical_thread=config.canonical_thread,
                           canonical_policy=FixedShapePolicy(attention_kernel=config.canonical_attention,
                                                            gemm=config.canonical_gemm,
                                                            tile_m=config.canonical_tile_m),
                           fast_policy=FastPolicy(decode_kernel=config.fast_decode_kernel,
                                                  canonical_key_chunk=canonical_key_chunk(config.canonical_attention),
                                                  canonical_tile_m=config.canonical_tile_m),
                           max_canonical_tokens=config.max_canonical_tokens,
                           canonical_stream=config.canonical_stream,
                           canonical_gemm_streams=config.canonical_gemm_streams, block_size=config.block_size)
        results["engine"] = {"num_canonical_rows": gen.canonical_config.num_rows,
                             "max_canonical_tokens": gen.max_canonical_tokens,
                             "max_fast_tokens": config.max_fast_tokens,
                             # every prefill row bucket before timing: a prompt whose last chunk needs a new
                             # bucket would otherwise time its capture (round 5's first 15K-token runs did);
                             # and the mixed steps of the ITL phase (its free batch beside a prompt's chunks)
                             "notes": capture_prefill_graphs(gen)
                             + capture_mixed_graphs(gen, decode_rows=(config.free_batch,))}
        run.save()
        run.guarded("ttft", lambda: ttft_phase(run, gen, model, config, ceilings, budget.phase(0.7)))
        run.guarded("itl", lambda: itl_phase(run, gen, model, config))
        gen.close()
    return results


def report(results: dict) -> str:
    lines = ["prompt tokens | mode | TTFT (ms) | prefill roofline (ms) | TTFT / roofline",
             "---: | --- | ---: | ---: | ---:"]
    for row in results.get("ttft", []):
        ratio = row["ttft_over_roofline"]
        lines.append(f"{row['prompt_tokens']} | {'det' if row['deterministic'] else 'free'} | {row['ttft_ms']:.1f} | "
                     f"{row['prefill_roofline_ms']:.2f} | {'-' if ratio is None else f'{ratio:.2f}'}")
    itl = results.get("itl")
    if itl and "det_over_free" in itl:
        lines.append(f"\nfree requests' gap p50 (ms): {itl['baseline']['p50_ms']:.2f} alone, "
                     f"{itl['free_prompt']['p50_ms']:.2f} while a {itl['itl_prompt_tokens']}-token free prompt "
                     f"is admitted, {itl['det_prompt']['p50_ms']:.2f} while a deterministic one is: "
                     f"det / free {itl['det_over_free']:.2f}")
    return "\n".join(lines)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m llm42.bench.long_prompts", description=__doc__.splitlines()[0])
    add_common_args(p, out_help="results JSON (default benchmarks/results/long_prompts_<device>_<model>.json)",
                    budget_s=400)
    p.add_argument("--model", default=None, help="8b (default on cuda), tiny (default on cpu), stories260k, "
                   "a checkpoint directory or a .gguf file")
    p.add_argument("--lengths", type=_ints, default=None, help="prompt lengths (default 512,...,32768 on cuda)")
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--free-batch", type=int, default=None, help="free requests decoding in the ITL phase")
    p.add_argument("--free-new-tokens", type=int, default=None)
    p.add_argument("--itl-prompt", type=int, default=None, help="the long prompt admitted in the ITL phase")
    p.add_argument("--itl-steps", type=int, default=None, help="baseline steps before the long prompt")
    p.add_argument("--max-fast-tokens", type=int, default=None)
    p.add_argument("--max-canonical-tokens", type=int, default=None,
                   help="rows one canonical pass may take (a multiple of R; default: the engine's, "
                   "max_fast_tokens rounded down to a multiple of R)")
    p.add_argument("--canonical-stream", action=argparse.BooleanOptionalAction, default=None,
                   help="CUDA: canonical passes on their own stream (DVRGenerator knob; default: the engine's, "
                        "on for CUDA)")
    p.add_argument("--canonical-gemm-streams", type=int, default=1,
                   help="CUDA: streams a wide canonical pass's R-row GEMM blocks run on side by side "
                        "(DVRGenerator(canonical_gemm_streams=...); 1: in turn)")
    p.add_argument("--canonical-thread", action="store_true",
                   help="CPU: canonical passes on a worker thread (DVRGenerator(canonical_thread=True))")
    p.add_argument("--block-size", type=int, default=16,
                   help="K/V page size (DVRGenerator(block_size=...)); a multiple of the 64-key blocks (64, 128) "
                        "lets the tiled attention read K/V through TMA descriptors on Hopper")
    return p.parse_args(argv)


def main(argv: list[str] | None = None, *, repo: Path | None = None) -> int:
    """0: every phase ran; 1: a phase failed or the budget cut the run; 2: nothing could run."""
    repo = Path.cwd() if repo is None else repo
    args = parse_args(argv)
    if args.replot is not None:  # this benchmark draws no plots: --replot prints a saved run's report
        print(report(json.loads(args.replot.read_text())))
        return 0
    pick = OnDevice(args)
    model = pick(args.model, "8b", "tiny")
    try:
        config = LongPromptConfig(
            device=args.device, model=model, dtype=pick.dtype, budget_s=args.budget_s, window=args.window,
            group=args.group, lengths=pick(args.lengths, (512, 2048, 8192, 15000, 32768), (16, 64)),
            reps=pick(args.reps, 3, 1), free_batch=pick(args.free_batch, 64, 4),
            free_new_tokens=pick(args.free_new_tokens, 2048, 64), itl_prompt=pick(args.itl_prompt, 8192, 64),
            itl_steps=pick(args.itl_steps, 32, 4), max_fast_tokens=pick(args.max_fast_tokens, 2048, 128),
            seed=args.seed, use_cuda_graphs=not args.no_cuda_graphs, canonical_thread=args.canonical_thread,
            canonical_attention=args.canonical_attention, canonical_gemm=args.canonical_gemm,
            canonical_tile_m=args.canonical_tile_m, fast_decode_kernel=args.fast_decode_kernel,
            max_canonical_tokens=args.max_canonical_tokens,
            canonical_stream=args.canonical_stream, canonical_gemm_streams=args.canonical_gemm_streams,
            block_size=args.block_size,
        )
        stem = model_label(Path(model)) if Path(model).exists() else model
        out = args.out or repo / "benchmarks" / "results" / f"long_prompts_{args.device}_{stem}.json"
        results = run_long_prompts(config, out=out, repo=repo)
    except (RuntimeError, ValueError, OSError) as exc:
        print(f"long_prompts: {exc}", file=sys.stderr)
        return 2
    return finish(results, out, no_plots=True, plotter="", report=report(results))


if __name__ == "__main__":
    sys.exit(main())
