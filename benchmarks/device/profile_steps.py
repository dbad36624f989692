"""Where an offline serving run's engine steps go, step by step: their kind, rows, wall time and device time.

    PYTHONPATH=src python3 benchmarks/device/profile_steps.py --out steps.json [--model smollm2|8b]
        [--num-requests 1000] [--max-num-seqs 256,512] [--max-fast-tokens 2048] [--mixed-steps on,off]

For each ``max_num_seqs`` the ShareGPT-like offline set (nondet, random weights of the model's shape) runs
twice through one ``DVRGenerator``: the first run captures every graph bucket the set needs, the second is
measured. Each step is classified by its plan (decode rows only, decode rows + prompt chunks, prompt chunks
only) and timed on the host (``step()``'s wall time) and on the device (CUDA events around the decode
graph's and the prefill graph's replays, read after the run). The report gives, per kind, the step count,
the mean wall and device milliseconds, and the share of the run's wall time; and the rows per step over
the run (the tail where few requests are left). ``--mixed-steps on,off`` runs each ``max_num_seqs`` with the
decode rows and prompt chunks of a step in one pass and in two. A diagnostic, not a benchmark.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from llm42 import DVRGenerator  # noqa: E402
from llm42.kernels import attention, tiled_attention  # noqa: E402
from llm42.model.config import llama31_8b_config  # noqa: E402
from llm42.model.weights import random_weights  # noqa: E402
from profile_serving import requests, smollm2_shape  # noqa: E402


class StepTimer:
    """The time of every call of ``owner.name``, summed by step (``self.step``, set by the caller): host wall
    milliseconds, or with ``on_device`` CUDA events around the call, read once, at the end."""

    def __init__(self, owner, name: str, *, on_device: bool = False):
        self.calls: list[tuple[int, object, object]] = []  # (step, start, end): perf_counter values or events
        self.step = -1
        self.on_device = on_device
        fn = getattr(owner, name)

        def now():
            if not on_device:
                return time.perf_counter()
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event

        def timed(*args, **kwargs):
            start = now()
            try:
                return fn(*args, **kwargs)
            finally:
                self.calls.append((self.step, start, now()))

        setattr(owner, name, timed)

    def per_step(self) -> dict[int, float]:
        out: dict[int, float] = {}
        for step, start, end in self.calls:
            ms = start.elapsed_time(end) if self.on_device else 1e3 * (end - start)
            out[step] = out.get(step, 0.0) + ms
        return out


def run_rows(fast, num_decode: int, num_prompt: int) -> int:
    """The rows a step's GEMMs run once padded to its graphs' buckets (decode rows, prompt rows, or both joined
    in a mixed step); the real rows where a step runs eagerly."""
    mixed, prefill, graphs = fast.mixed, fast.fast_prefill, fast.decode_graphs
    if num_decode and num_prompt and mixed is not None and mixed.graphs is not None:
        return mixed.decode_bucket(num_decode) + prefill.bucket_for(num_prompt)
    rows = 0
    if num_decode:
        rows += graphs.bucket_for(num_decode) if graphs is not None and num_decode <= graphs.max_batch_size \
            else num_decode
    if num_prompt:
        rows += prefill.bucket_for(num_prompt)
    return rows


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def record_plans(gen: DVRGenerator) -> list[tuple[int, int, int]]:
    """Each step's plan from now on, appended to the returned list as (decode rows, prompt rows, canonical
    segments): ``gen.scheduler.schedule`` wrapped by an instance attribute (``del gen.scheduler.schedule`` ends it)."""
    plans: list[tuple[int, int, int]] = []
    schedule = gen.scheduler.schedule

    def recording(state):
        plan = schedule(state)
        plans.append((len(plan.fast_decode), sum(c.num_tokens for c in plan.fast_prefill),
                      len(plan.verify) + len(plan.canonical_prefill)))
        return plan

    gen.scheduler.schedule = recording
    return plans


def measure(gen: DVRGenerator, prompts, params) -> dict:
    plans = record_plans(gen)
    fast = gen.fast_step
    timers = {}
    if fast.decode_graphs is not None:
        timers["decode"] = StepTimer(fast.decode_graphs, "run", on_device=True)
    if fast.fast_prefill.graphs is not None:
        timers["prefill"] = StepTimer(fast.fast_prefill.graphs, "run", on_device=True)
    if fast.mixed is not None and fast.mixed.graphs is not None:
        timers["mixed"] = StepTimer(fast.mixed.graphs, "run", on_device=True)
    host = {"launch_host": StepTimer(fast, "launch"), "read_host": StepTimer(fast, "read"),
            "schedule_host": StepTimer(gen.scheduler, "schedule")}
    for p, s in zip(prompts, params):
        gen.submit(p, s)
    walls: list[float] = []
    sync()
    t0 = time.perf_counter()
    while gen.has_unfinished():
        for timer in (*timers.values(), *host.values()):
            timer.step = len(walls)
        t = time.perf_counter()
        gen.step()
        walls.append(time.perf_counter() - t)
    sync()
    wall = time.perf_counter() - t0
    wrapped = [(fast, "launch"), (fast, "read"), (gen.scheduler, "schedule")]
    wrapped += [(fast.decode_graphs, "run")] if "decode" in timers else []
    wrapped += [(fast.fast_prefill.graphs, "run")] if "prefill" in timers else []
    wrapped += [(fast.mixed.graphs, "run")] if "mixed" in timers else []
    for owner, name in wrapped:
        delattr(owner, name)  # the instance wrappers: back to the class's methods
    device = {k: timer.per_step() for k, timer in (*timers.items(), *host.items())}
    kinds: dict[str, dict] = {}
    for i, (w, (d, p, c)) in enumerate(zip(walls, plans)):
        kind = "decode" if d and not p else "mixed" if d and p else "prefill" if p else "other"
        k = kinds.setdefault(kind, {"steps": 0, "wall_ms": 0.0, "decode_graph_ms": 0.0, "prefill_graph_ms": 0.0,
                                    "mixed_graph_ms": 0.0, "decode_rows": 0, "prefill_rows": 0, "padded_rows": 0,
                                    "launch_host_ms": 0.0,
                                    "read_host_ms": 0.0, "schedule_host_ms": 0.0})
        k["steps"] += 1
        k["wall_ms"] += 1e3 * w
        k["decode_graph_ms"] += device.get("decode", {}).get(i, 0.0)
        k["prefill_graph_ms"] += device.get("prefill", {}).get(i, 0.0)
        k["mixed_graph_ms"] += device.get("mixed", {}).get(i, 0.0)
        for key in ("launch_host", "read_host", "schedule_host"):
            k[f"{key}_ms"] += device[key].get(i, 0.0)
        k["decode_rows"] += d
        k["prefill_rows"] += p
        k["padded_rows"] += run_rows(fast, d, p)
    for k in kinds.values():
        n = k["steps"]
        k["share_of_wall"] = round(k["wall_ms"] / (1e3 * wall), 4)
        k["rows_run_over_real"] = round(k["padded_rows"] / max(1, k["decode_rows"] + k["prefill_rows"]), 4)
        for key in ("wall_ms", "decode_graph_ms", "prefill_graph_ms", "mixed_graph_ms", "decode_rows",
                    "prefill_rows", "padded_rows", "launch_host_ms", "read_host_ms", "schedule_host_ms"):
            k[f"mean_{key}"] = round(k.pop(key) / n, 4)
    out_tokens = sum(p.max_new_tokens for p in params)
    # decode rows per step in tenths of the run: the tail where few requests are left
    tenths = []
    n = len(plans)
    for j in range(10):
        part = plans[j * n // 10: (j + 1) * n // 10]
        part_walls = walls[j * n // 10: (j + 1) * n // 10]
        tenths.append({"steps": len(part), "mean_decode_rows": round(sum(x[0] for x in part) / max(1, len(part)), 1),
                       "mean_prefill_rows": round(sum(x[1] for x in part) / max(1, len(part)), 1),
                       "wall_s": round(sum(part_walls), 4)})
    # decode-graph device time by batch bucket, decode-only steps (how a step's cost grows with the batch)
    by_batch: dict[int, list[float]] = {}
    for i, (d, p, _) in enumerate(plans):
        if d and not p and i in device.get("decode", {}):
            by_batch.setdefault(fast.decode_graphs.bucket_for(d), []).append(device["decode"][i])
    return {"wall_s": round(wall, 4), "steps": len(walls), "output_tokens": out_tokens,
            "output_tok_per_s": round(out_tokens / wall, 1), "ms_per_step": round(1e3 * wall / len(walls), 4),
            "kinds": kinds, "tenths": tenths,
            "decode_graph_ms_by_bucket": {b: round(sorted(v)[len(v) // 2], 4) for b, v in sorted(by_batch.items())}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", choices=("smollm2", "8b"), default="smollm2")
    ap.add_argument("--num-requests", type=int, default=1000)
    ap.add_argument("--max-num-seqs", default="256")
    ap.add_argument("--max-fast-tokens", type=int, default=2048)
    ap.add_argument("--length-scale", type=float, default=1.0)
    ap.add_argument("--mixed-steps", default="default", help="comma-separated: default, on, off (one run each)")
    ap.add_argument("--split-waves", default="default",
                    help="comma-separated decode split targets (DECODE_SPLIT_WAVES): default or an int (one run each)")
    ap.add_argument("--prefill-configs", default="current",
                    help="comma-separated fast prefill attention configs: current, or BMxBNxWARPSxSTAGES "
                         "(one run each)")
    ap.add_argument("--bucket-steps", default="default",
                    help="comma-separated graph_bucket_step values: default (the model's) or an int (one run each; "
                         "a step >= max_fast_tokens is the powers-of-two ladder)")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    cfg = smollm2_shape() if args.model == "smollm2" else llama31_8b_config(max_position_embeddings=4096)
    weights = random_weights(cfg, seed=0, dtype=torch.bfloat16, device=args.device)
    name = torch.cuda.get_device_name() if args.device == "cuda" else args.device
    result: dict = {"args": vars(args), "device": name, "runs": {}}
    prompts, params = requests(args.num_requests, cfg.vocab_size, args.length_scale)
    runs = [(int(s), m, c, w, b) for s in args.max_num_seqs.split(",") for m in args.mixed_steps.split(",")
            for c in args.prefill_configs.split(",") for w in args.split_waves.split(",")
            for b in args.bucket_steps.split(",")]
    current = tiled_attention.PREFILL_SMALL, tiled_attention.PREFILL_LARGE
    default_waves = attention.DECODE_SPLIT_WAVES
    for seqs, mixed, config, waves, step in runs:
        attention.DECODE_SPLIT_WAVES = default_waves if waves == "default" else int(waves)
        # the fast prefill kernel's launch configuration: "current", or block_m x block_n x warps x stages for all
        tiled_attention.PREFILL_SMALL, tiled_attention.PREFILL_LARGE = (
            current if config == "current" else (tuple(int(x) for x in config.split("x")),) * 2)
        gen = DVRGenerator(weights, cfg, max_num_seqs=seqs, max_fast_tokens=max(args.max_fast_tokens, seqs),
                           mixed_steps={"default": None, "on": True, "off": False}[mixed],
                           graph_bucket_step=None if step == "default" else int(step))
        t = time.perf_counter()
        warm = measure(gen, prompts, params)
        run = measure(gen, prompts, params)
        run["warmup_s"] = round(time.perf_counter() - t - run["wall_s"], 2)
        run["warmup_output_tok_per_s"] = warm["output_tok_per_s"]
        run["mixed_steps"] = gen.stats["mixed_steps"]
        is_mixed = gen.fast_step.mixed is not None and gen.fast_step.mixed.graphs is not None
        run["mixed_graphs_captured"] = gen.fast_step.mixed.graphs.num_captured if is_mixed else 0
        run["prefill_graph_buckets"] = list(gen.fast_step.fast_prefill.graphs.buckets) if is_mixed else []
        run["mixed_decode_buckets"] = list(gen.fast_step.mixed.decode_buckets()) if is_mixed else []
        run["graph_bucket_step"] = gen.config.bucket_step(cfg)
        run["prefill_config"] = config
        run["split_waves"] = attention.DECODE_SPLIT_WAVES
        key = str(seqs) if mixed == "default" else f"{seqs}/mixed_{mixed}"
        key = key if config == "current" else f"{key}/prefill_{config}"
        key = key if waves == "default" else f"{key}/waves_{waves}"
        result["runs"][key if step == "default" else f"{key}/step_{step}"] = run
        print(json.dumps({"max_num_seqs": seqs, "mixed": mixed, "prefill_config": config, "bucket_step": step,
                          "split_waves": run["split_waves"], "mixed_graphs": run["mixed_graphs_captured"],
                          **{k: run[k] for k in ("output_tok_per_s", "ms_per_step", "steps")},
                          "kinds": run["kinds"]}, indent=1), flush=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
        gen.close()
        del gen
        if args.device == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
