"""Where the K/V store is smaller than the request set: what admission by budget changes in engine steps (nondet).

    PYTHONPATH=src python3 benchmarks/cpu_admission_kv.py [--out benchmarks/results/cpu_admission_kv.json]
        [--num-requests 1000] [--kv-tokens 570000,400000,280000] [--max-num-seqs 1024] [--max-fast-tokens 2048]

Round 33's 8B-shape runs on an H100 (`benchmarks/results/h100_round33/call_a3/`: 1,000 ShareGPT-like requests, all
at t = 0, `max_num_seqs` 1,024) ended on request 998, a 1,024-token reply whose first token came at 25.2 s of a
54.0 s run: the benchmark sizes the K/V store at 60 % of the memory free after the weights, which on an 80 GB card
holds about half of the set's 565K positions (admission reserves a request's whole length), so the last requests in
arrival order wait for the first to finish; on an H200 (141 GB) nearly the whole set fits.

This runs the engine itself (``DVRGenerator``, a one-layer model of width 32 on the CPU, random ids) on the same
request lengths (``sharegpt_like(1000, length_scale=1, seed=0)``: 281,011 prompt and 283,876 output tokens),
every request free (nondet), with ``--kv-tokens`` K/V positions, the default scheduler with admission by arrival and
by budget (``DefaultScheduler(admission=)``). Reported, in engine steps: the run's length, the step of the last
first token, the finish of the longest replies; and the rows run per step. It counts steps, not time: a step with
more rows costs more on a device (a mixed step of 2,048 rows of the 8B shape is ~4x a 64-row decode step, round 17),
so a shorter run in steps that fills its steps more is a smaller gain in time than in steps. The device A/B is the
next round's (`benchmarks/device/r34_call_a.sh`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from llm42 import DefaultScheduler, DVRGenerator, SamplingParams
from llm42.bench.workloads import sharegpt_like
from llm42.model.config import ModelConfig, RopeConfig
from llm42.model.weights import random_weights

REPO = Path(__file__).resolve().parents[1]
ADMISSIONS = ("arrival", "budget")


def run(*, num_requests: int, kv_tokens: int, admission: str, max_num_seqs: int, max_fast_tokens: int,
        order: str = "arrival", seed: int = 0) -> dict:
    cfg = ModelConfig(family="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                      num_kv_heads=1, head_dim=16, max_position_embeddings=4096, rms_norm_eps=1e-5,
                      rope=RopeConfig(theta=10000.0), eos_token_ids=(2,), bos_token_id=1)
    gen = DVRGenerator(random_weights(cfg, seed=seed), cfg, max_num_seqs=max_num_seqs,
                       max_fast_tokens=max_fast_tokens, kv_cache_tokens=kv_tokens,
                       scheduler=DefaultScheduler(order=order, admission=admission))
    workload = sharegpt_like(num_requests, length_scale=1.0, vocab_size=cfg.vocab_size, seed=seed)
    rids = [gen.submit(list(r.prompt), SamplingParams(max_new_tokens=r.max_new_tokens, ignore_eos=True,
                                                       temperature=r.temperature, seed=r.seed))
            for r in workload.requests]
    budgets = {rid: r.max_new_tokens for rid, r in zip(rids, workload.requests)}
    first, finish, steps, rows = {}, {}, 0, []
    started = time.perf_counter()
    while gen.has_unfinished():
        before = gen.stats["fast_tokens"]
        events = gen.step()
        steps += 1
        rows.append(gen.stats["fast_tokens"] - before)
        for rid in events:
            first.setdefault(rid, steps)
        for rid in events:
            if rid not in finish and gen.is_finished(rid):
                finish[rid] = steps
    outputs = [gen.result(rid).token_ids for rid in rids]
    gen.close()
    longest = sorted(rids, key=lambda r: (-budgets[r], r))[:10]
    return {
        "steps": steps, "host_s": round(time.perf_counter() - started, 1),
        "last_first_token_step": max(first.values()),
        "first_token_step_p50": statistics.median(first.values()),
        "longest_replies": [{"rid": r, "max_new_tokens": budgets[r], "first_token_step": first[r],
                             "finish_step": finish[r]} for r in longest],
        "rows_per_step": {"mean": round(statistics.fmean(rows), 1), "p50": statistics.median(rows),
                          "last_tenth_mean": round(statistics.fmean(rows[-max(1, steps // 10):]), 1)},
        "output_tokens": sum(len(t) for t in outputs),
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/cpu_admission_kv.json"))
    ap.add_argument("--num-requests", type=int, default=1000)
    ap.add_argument("--kv-tokens", default="570000,400000,280000")
    ap.add_argument("--max-num-seqs", type=int, default=1024)
    ap.add_argument("--max-fast-tokens", type=int, default=2048)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    out = {"command": "python benchmarks/cpu_admission_kv.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out"), "cases": {}}
    for kv in (int(x) for x in args.kv_tokens.split(",")):
        case = {a: run(num_requests=args.num_requests, kv_tokens=kv, admission=a, max_num_seqs=args.max_num_seqs,
                       max_fast_tokens=args.max_fast_tokens) for a in ADMISSIONS}
        case["steps_budget_over_arrival"] = round(case["budget"]["steps"] / case["arrival"]["steps"], 3)
        out["cases"][f"kv_{kv}"] = case
        print(f"kv {kv}: steps arrival {case['arrival']['steps']} / budget {case['budget']['steps']} "
              f"(x{case['steps_budget_over_arrival']}); last first token {case['arrival']['last_first_token_step']}"
              f" / {case['budget']['last_first_token_step']}; rows per step {case['arrival']['rows_per_step']['mean']}"
              f" / {case['budget']['rows_per_step']['mean']}", flush=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
