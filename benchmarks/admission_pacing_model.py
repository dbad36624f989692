"""A model (not a measurement) of how admission spreads the 8B shape's offline set over its steps, and what an even
spread would save. Round 49 measured a larger K/V store serving the set slower (9.1-9.8K against 11.1K tok/s on an
H100, the same 1,030 steps): the longest request's 1,024 tokens fix the step count, so rows taken early leave thin
steps at the end, each paying its weights' read whatever its rows.

    python3 benchmarks/admission_pacing_model.py --out benchmarks/results/cpu_round49/admission_pacing_model.json

The engine modelled: 1,000 ShareGPT-like requests (the serving benchmark's set, seed 0) all waiting at t = 0,
admitted largest output first (``admission="budget"``) while a seat (``--seats``) and the K/V reservation (a
request's prompt + output, ``--kv-positions``) allow, stopping at the first that does not fit; each step takes every
decode row, then prompt rows of admitted requests up to ``--max-rows`` in admission order (a prompt's last row
gives its first token). A step's time: its GEMMs at max(the weights' read, its rows' FLOPs at ``--gemm-tflops``),
its decode rows' K and V at ``--attn-tbps``, plus ``--step-overhead-ms``; the prompt rows' attention is left out.
Calibrated by hand against round 47's profile on an H100 (309 decode rows: 8.05 ms of GEMMs; 37 rows: 5.85; K/V
at 2.4 TB/s) and checked against round 49's measured runs (0.6 and 0.85 of the free memory: 247K and 349K
positions). ``paced_*``: the same, with the admitted requests capped at a target (``--paced-rows``), so that
requests wait to ride with the tail instead of front-loading the steps.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from llm42.bench.workloads import sharegpt_like  # noqa: E402

WEIGHT_BYTES = 16.06e9  # Llama-3.1-8B in bf16
PARAMS = 8.03e9
KV_BYTES_PER_POSITION = 2 * 32 * 8 * 128 * 2  # K and V, 32 layers, 8 kv heads, head dim 128, bf16


def simulate(lengths: list[tuple[int, int]], *, seats: int, kv_positions: int, max_rows: int, max_running: int | None,
             weight_tbps: float, gemm_tflops: float, attn_tbps: float, overhead_ms: float) -> dict:
    """Steps, seconds, output tok/s and the decode rows' distribution of one offline run of ``lengths``."""
    waiting = sorted(range(len(lengths)), key=lambda i: (-lengths[i][1], i))  # the budget admission order
    running: list[dict] = []  # admitted: prompt rows left, output tokens left, context
    reserved = 0
    steps, seconds, decode_rows_by_step = 0, 0.0, []
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
        decoding = [r for r in running if r["prompt"] == 0]
        rows = len(decoding)
        kv_bytes = sum(r["context"] + 1 for r in decoding) * KV_BYTES_PER_POSITION
        for r in decoding:
            r["context"] += 1
            r["output"] -= 1
        budget = max_rows - rows
        for r in running:
            if budget <= 0:
                break
            if r["prompt"] > 0:
                n = min(r["prompt"], budget)
                r["prompt"] -= n
                r["context"] += n
                budget -= n
                rows += n
                if r["prompt"] == 0:
                    r["output"] -= 1  # the prompt's last row samples the first token
        gemm_s = max(WEIGHT_BYTES / (weight_tbps * 1e12), 2 * PARAMS * rows / (gemm_tflops * 1e12))
        seconds += gemm_s + kv_bytes / (attn_tbps * 1e12) + overhead_ms / 1e3
        steps += 1
        decode_rows_by_step.append(len(decoding))
        done = [r for r in running if r["prompt"] == 0 and r["output"] <= 0]
        for r in done:
            reserved -= r["reserve"]
            running.remove(r)
    tokens = sum(o for _, o in lengths)
    thin = sum(1 for n in decode_rows_by_step if n < 64)
    return {"steps": steps, "seconds": round(seconds, 3), "output_tok_s": round(tokens / seconds, 1),
            "steps_under_64_decode_rows": thin,
            "decode_rows_p50": sorted(decode_rows_by_step)[len(decode_rows_by_step) // 2],
            "decode_rows_max": max(decode_rows_by_step)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seats", type=int, default=1024)
    ap.add_argument("--max-rows", type=int, default=2048)
    ap.add_argument("--kv-positions", default="246528,349249", help="round 49's stores at 0.6 and 0.85 on an H100")
    ap.add_argument("--paced-rows", default="256,288,320")
    ap.add_argument("--weight-tbps", type=float, default=2.75, help="round 47's tail: 16 GB of weights in 5.85 ms")
    ap.add_argument("--gemm-tflops", type=float, default=620.0, help="round 47: 543-706 TFLOP/s")
    ap.add_argument("--attn-tbps", type=float, default=2.4, help="round 47: 2.2-2.5 TB/s")
    ap.add_argument("--step-overhead-ms", type=float, default=1.3, help="round 47: row ops, sampler, copies")
    args = ap.parse_args()
    workload = sharegpt_like(1000, length_scale=1.0, vocab_size=128256, seed=0)
    lengths = [(len(r.prompt), r.max_new_tokens) for r in workload.requests]
    cost = dict(weight_tbps=args.weight_tbps, gemm_tflops=args.gemm_tflops, attn_tbps=args.attn_tbps,
                overhead_ms=args.step_overhead_ms)
    out = {"model": "benchmarks/admission_pacing_model.py (a model, not a measurement)", "args": vars(args),
           "measured_round49_h100": {"246528": 11091, "349249": [9065, 9807]}, "runs": {}}
    for kv in (int(x) for x in args.kv_positions.split(",")):
        out["runs"][f"store_{kv}"] = simulate(lengths, seats=args.seats, kv_positions=kv, max_rows=args.max_rows,
                                              max_running=None, **cost)
        for target in (int(x) for x in args.paced_rows.split(",")):
            out["runs"][f"store_{kv}_paced_{target}"] = simulate(
                lengths, seats=args.seats, kv_positions=kv, max_rows=args.max_rows, max_running=target, **cost)
    for name, run in out["runs"].items():
        print(name, json.dumps(run), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
