"""A model (not a measurement) of how admission spreads the 8B shape's offline set over its steps, and what an even
spread would save. Round 49 measured a larger K/V store serving the set slower (9.1-9.8K against 11.1K tok/s on an
H100, the same 1,030 steps): the longest request's 1,024 tokens fix the step count, so rows taken early leave thin
steps at the end, each paying its weights' read whatever its rows.

    python3 benchmarks/admission_pacing_model.py --out benchmarks/results/cpu_round49/admission_pacing_model.json
    python3 benchmarks/admission_pacing_model.py --engine-trace \\
        --gemm-table benchmarks/results/h100_round52/gemm_rows_8b_step_totals.json \\
        --out benchmarks/results/cpu_round57/admission_pacing_model_table.json

The engine modelled: 1,000 ShareGPT-like requests (the serving benchmark's set, seed 0) all waiting at t = 0,
admitted largest output first (``admission="budget"``) while a seat (``--seats``) and the K/V reservation (a
request's prompt + output, ``--kv-positions``) allow, stopping at the first that does not fit; each step takes every
decode row, then prompt rows of admitted requests up to ``--max-rows`` in admission order (a prompt's last row
gives its first token). ``paced_*``: the same, with the admitted requests capped at a target (``--paced-rows``), so
that requests wait to ride with the tail instead of front-loading the steps.

A step's time: its GEMMs, its decode rows' K and V at ``--attn-tbps``, plus ``--step-overhead-ms``; the prompt rows'
attention is left out. The GEMMs, by default, at max(the weights' read at ``--weight-tbps``, its rows' FLOPs at
``--gemm-tflops``), calibrated by hand against round 47's profile on an H100 (309 decode rows: 8.05 ms of GEMMs; 37
rows: 5.85; K/V at 2.4 TB/s). With ``--gemm-table`` (round 52's cuBLAS table: a decode step's GEMMs in ms at each M,
``by_M[M]["step_ms"]``) they cost what cuBLAS took at the step's graph bucket (its rows rounded up to 16), below the
table's smallest M on a line from the weights' read at no rows, above its largest at the slope of its upper half.

``--engine-trace``: the same set also scheduled by the engine itself (``DVRGenerator`` with
``DefaultScheduler(admission="budget")`` over a one-layer model of width 32, on this CPU: about 80 s a store), each
of its steps' decode rows, prompt rows and K/V positions recorded and priced the same way (``engine_store_*``), so
the model's admission is checked against the engine's.
"""

from __future__ import annotations

import argparse
import bisect
import json
import sys
from pathlib import Path
from typing import Callable, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from llm42.bench.workloads import sharegpt_like  # noqa: E402

WEIGHT_BYTES = 16.06e9  # Llama-3.1-8B in bf16
PARAMS = 8.03e9
KV_BYTES_PER_POSITION = 2 * 32 * 8 * 128 * 2  # K and V, 32 layers, 8 kv heads, head dim 128, bf16
GRAPH_BUCKET = 16  # a decode batch runs the graph of its rows rounded up to this (cuda_graphs.decode_buckets)


class StepShape(NamedTuple):
    """One step's work: decode rows, prompt rows, and the K/V positions its decode rows read."""

    decode_rows: int
    prompt_rows: int
    kv_positions: int

    @property
    def rows(self) -> int:
        return self.decode_rows + self.prompt_rows


def roofline_gemm(weight_tbps: float, gemm_tflops: float) -> Callable[[int], float]:
    """A step's GEMM ms at ``rows``: max(the weights' read, the rows' FLOPs)."""
    return lambda rows: 1e3 * max(WEIGHT_BYTES / (weight_tbps * 1e12), 2 * PARAMS * rows / (gemm_tflops * 1e12))


def table_gemm(step_ms_by_m: dict[int, float], weight_tbps: float) -> Callable[[int], float]:
    """A step's GEMM ms at ``rows`` from a measured table (ms at each M): the table's value at the rows' graph bucket
    (the next M of the table at or above it); below the smallest M, on a line from the weights' read at no rows to
    it; above the largest, that plus the slope of the table's upper half per row."""
    ms = sorted(step_ms_by_m)
    if not ms:
        raise ValueError("table_gemm: an empty table")
    low, high = ms[0], ms[-1]
    floor_ms = 1e3 * WEIGHT_BYTES / (weight_tbps * 1e12)
    half = ms[bisect.bisect_left(ms, high // 2)] if high // 2 >= low else low
    slope = (step_ms_by_m[high] - step_ms_by_m[half]) / (high - half) if high > half else 0.0

    def gemm_ms(rows: int) -> float:
        if rows <= low:
            return floor_ms + (step_ms_by_m[low] - floor_ms) * rows / low
        if rows > high:
            return step_ms_by_m[high] + slope * (rows - high)
        bucket = -(-rows // GRAPH_BUCKET) * GRAPH_BUCKET
        return step_ms_by_m[ms[min(bisect.bisect_left(ms, bucket), len(ms) - 1)]]

    return gemm_ms


def gemm_cost(weight_tbps: float, gemm_tflops: float, table: dict[int, float] | None) -> Callable[[int], float]:
    """``table_gemm`` of ``table`` where one is given, else ``roofline_gemm``."""
    return roofline_gemm(weight_tbps, gemm_tflops) if table is None else table_gemm(table, weight_tbps)


def schedule(lengths: list[tuple[int, int]], *, seats: int, kv_positions: int, max_rows: int,
             max_running: int | None) -> list[StepShape]:
    """The model's steps for one offline run of ``lengths`` ((prompt, output) per request)."""
    waiting = sorted(range(len(lengths)), key=lambda i: (-lengths[i][1], i))  # the budget admission order
    running: list[dict] = []  # admitted: prompt rows left, output tokens left, context
    reserved = 0
    steps = []
    while waiting or running:
        while waiting and len(running) < seats:
            prompt, output = lengths[waiting[0]]
            if reserved + prompt + output > kv_positions:
                break
            if max_running is not None and len(running) >= max_running:
                break
            waiting.pop(0)
            reserved += prompt + output
            running.append({"prompt": prompt, "output": output, "context": 0, "reserve": prompt + output})
        if not running:
            raise ValueError(f"schedule: a request of {sum(lengths[waiting[0]])} positions does not fit a store of "
                             f"{kv_positions}")
        decoding = [r for r in running if r["prompt"] == 0]
        read = sum(r["context"] + 1 for r in decoding)
        for r in decoding:
            r["context"] += 1
            r["output"] -= 1
        budget = max_rows - len(decoding)
        prompt_rows = 0
        for r in running:
            if budget <= 0:
                break
            if r["prompt"] > 0:
                n = min(r["prompt"], budget)
                r["prompt"] -= n
                r["context"] += n
                budget -= n
                prompt_rows += n
                if r["prompt"] == 0:
                    r["output"] -= 1  # the prompt's last row samples the first token
        steps.append(StepShape(len(decoding), prompt_rows, read))
        done = [r for r in running if r["prompt"] == 0 and r["output"] <= 0]
        for r in done:
            reserved -= r["reserve"]
            running.remove(r)
    return steps


def price(steps: list[StepShape], num_tokens: int, *, gemm_ms: Callable[[int], float], attn_tbps: float,
          overhead_ms: float) -> dict:
    """Seconds and output tok/s of ``steps`` at a cost per step, and the decode rows' distribution."""
    seconds = sum(gemm_ms(s.rows) / 1e3 + s.kv_positions * KV_BYTES_PER_POSITION / (attn_tbps * 1e12)
                  + overhead_ms / 1e3 for s in steps)
    decode = [s.decode_rows for s in steps]
    return {"steps": len(steps), "seconds": round(seconds, 3), "output_tok_s": round(num_tokens / seconds, 1),
            "steps_under_64_decode_rows": sum(1 for n in decode if n < 64),
            "steps_with_prompt_rows": sum(1 for s in steps if s.prompt_rows),
            "decode_rows_p50": sorted(decode)[len(decode) // 2], "decode_rows_max": max(decode)}


def simulate(lengths: list[tuple[int, int]], *, seats: int, kv_positions: int, max_rows: int, max_running: int | None,
             weight_tbps: float, gemm_tflops: float, attn_tbps: float, overhead_ms: float,
             gemm_table: dict[int, float] | None = None) -> dict:
    """Steps, seconds, output tok/s and the decode rows' distribution of one offline run of ``lengths``."""
    steps = schedule(lengths, seats=seats, kv_positions=kv_positions, max_rows=max_rows, max_running=max_running)
    return price(steps, sum(o for _, o in lengths), gemm_ms=gemm_cost(weight_tbps, gemm_tflops, gemm_table),
                 attn_tbps=attn_tbps, overhead_ms=overhead_ms)


def engine_trace(lengths: list[tuple[int, int]], *, seats: int, kv_positions: int, max_rows: int) -> list[StepShape]:
    """The steps the engine itself runs for ``lengths`` (every request free, greedy, ``ignore_eos``):
    ``DVRGenerator`` with ``DefaultScheduler(admission="budget")`` over a one-layer model of width 32 (its steps'
    shapes do not depend on the model), each plan's decode rows, prompt rows and the K/V positions its decode rows
    read (a request's prompt rows and decode steps so far, plus the row's own)."""
    import torch

    from llm42 import DVRGenerator, SamplingParams
    from llm42.model.config import ModelConfig, RopeConfig
    from llm42.model.weights import random_weights
    from llm42.scheduler import DefaultScheduler

    torch.set_num_threads(1)
    longest = max(p + o for p, o in lengths) + 64
    cfg = ModelConfig(family="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                      num_kv_heads=1, head_dim=16, max_position_embeddings=longest, rms_norm_eps=1e-5,
                      rope=RopeConfig(theta=10000.0), eos_token_ids=(2,), bos_token_id=1)
    scheduler = DefaultScheduler(admission="budget")
    plan_of = scheduler.schedule
    steps: list[StepShape] = []
    context: dict[int, int] = {}

    def traced(state):
        plan = plan_of(state)
        read = sum(context.get(rid, 0) + 1 for rid in plan.fast_decode)
        for rid in plan.fast_decode:
            context[rid] = context.get(rid, 0) + 1
        for chunk in plan.fast_prefill:
            context[chunk.rid] = context.get(chunk.rid, 0) + chunk.num_tokens
        steps.append(StepShape(len(plan.fast_decode), sum(c.num_tokens for c in plan.fast_prefill), read))
        return plan

    scheduler.schedule = traced
    gen = DVRGenerator(random_weights(cfg, seed=0), cfg, window=32, group=8, max_num_seqs=seats,
                       max_fast_tokens=max_rows, kv_cache_tokens=kv_positions, prefix_cache=False, scheduler=scheduler)
    try:
        for i, (prompt, output) in enumerate(lengths):
            gen.submit([3 + (i + j) % 60 for j in range(prompt)],
                       SamplingParams(max_new_tokens=output, ignore_eos=True))
        while gen.has_unfinished():
            gen.step()
    finally:
        gen.close()
    return steps


def gemm_table_of(path: Path) -> dict[int, float]:
    """``by_M[M]["step_ms"]`` of a cuBLAS table (round 52's ``gemm_rows_8b_step_totals.json``)."""
    return {int(m): row["step_ms"] for m, row in json.loads(path.read_text())["by_M"].items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seats", type=int, default=1024)
    ap.add_argument("--max-rows", type=int, default=2048)
    ap.add_argument("--kv-positions", default="246528,349249", help="round 49's stores at 0.6 and 0.85 on an H100")
    ap.add_argument("--paced-rows", default="256,288,320")
    ap.add_argument("--weight-tbps", type=float, default=2.75, help="round 47's tail: 16 GB of weights in 5.85 ms")
    ap.add_argument("--gemm-tflops", type=float, default=620.0, help="round 47: 543-706 TFLOP/s")
    ap.add_argument("--gemm-table", type=Path, default=None,
                    help="a decode step's GEMM ms by M (round 52's gemm_rows_8b_step_totals.json) instead of the "
                    "roofline of --weight-tbps and --gemm-tflops")
    ap.add_argument("--attn-tbps", type=float, default=2.4, help="round 47: 2.2-2.5 TB/s")
    ap.add_argument("--step-overhead-ms", type=float, default=1.3, help="round 47: row ops, sampler, copies")
    ap.add_argument("--engine-trace", action="store_true", help="also schedule the set with the engine (CPU)")
    args = ap.parse_args()
    workload = sharegpt_like(1000, length_scale=1.0, vocab_size=128256, seed=0)
    lengths = [(len(r.prompt), r.max_new_tokens) for r in workload.requests]
    num_tokens = sum(o for _, o in lengths)
    table = None if args.gemm_table is None else gemm_table_of(args.gemm_table)
    cost = dict(gemm_ms=gemm_cost(args.weight_tbps, args.gemm_tflops, table), attn_tbps=args.attn_tbps,
                overhead_ms=args.step_overhead_ms)
    shape = dict(seats=args.seats, max_rows=args.max_rows)
    out = {"model": "benchmarks/admission_pacing_model.py (a model, not a measurement)",
           "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
           "measured_round49_h100": {"246528": 11091, "349249": [9065, 9807]}, "runs": {}}
    for kv in (int(x) for x in args.kv_positions.split(",")):
        out["runs"][f"store_{kv}"] = price(schedule(lengths, kv_positions=kv, max_running=None, **shape),
                                           num_tokens, **cost)
        for target in (int(x) for x in args.paced_rows.split(",") if x):
            out["runs"][f"store_{kv}_paced_{target}"] = price(
                schedule(lengths, kv_positions=kv, max_running=target, **shape), num_tokens, **cost)
        if args.engine_trace:
            out["runs"][f"engine_store_{kv}"] = price(engine_trace(lengths, kv_positions=kv, **shape), num_tokens,
                                                      **cost)
    for name, run in out["runs"].items():
        print(name, json.dumps(run), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
