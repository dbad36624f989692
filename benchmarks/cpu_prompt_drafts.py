"""What ``prompt_drafts`` changes in engine steps, with canonical passes that take several steps (round 30).

    PYTHONPATH=src python3 benchmarks/cpu_prompt_drafts.py [--out benchmarks/results/cpu_prompt_drafts.json]
        [--num-requests 200] [--share 0.5] [--lags 2,4] [--orders arrival,budget]

A step-count model of a busy device, not a timing: the CPU runs each canonical pass when it is launched, and the
engine is told it is done only ``lag`` engine steps later (round 25's real SmolLM2 runs took 3-4.6 ms a step and
5-9 ms a wide pass, with passes queued behind passes: two to four steps). Every request is submitted at step 0
(ShareGPT-like lengths scaled by 1/8, random ids, a one-layer model of width 32), ``--share`` of them
deterministic; each configuration runs with ``prompt_drafts`` off and on. Reported, in engine steps: the run's
length, the deterministic requests' first committed token and finish (p50 / p90 / max), the free requests' finish,
and the rows the fast path spent on prompts it ran for drafts; the deterministic outputs of both runs must be
identical (``same_bits``: the contract, with the fast path doing more work). ``--orders``: the default scheduler's
order of service (``DefaultScheduler(order=)``: ``arrival``, the default, or ``budget``, the largest output budget
left first), each a case of its own.

What it cannot say: how much a step costs. Prompt drafts add fast rows (the deterministic prompts run twice), which
on a device bound by the fast steps' rows lengthens the steps; whether the steps saved outweigh it is the H200 A/B's
(``benchmarks/device/r30_call_b.sh``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import time
from pathlib import Path

import torch

from llm42 import DefaultScheduler, DVRGenerator, SamplingParams
from llm42.bench.modes import deterministic_order
from llm42.bench.workloads import sharegpt_like
from llm42.model.config import ModelConfig, RopeConfig
from llm42.model.weights import random_weights
from llm42.verify.verifier import LaunchedPass

REPO = Path(__file__).resolve().parents[1]


class _DoneAfter:
    """A launched pass's result that reads as finished only once ``gen`` has made ``lag`` more steps."""

    def __init__(self, result, gen: DVRGenerator, lag: int):
        self._result, self._gen, self._ready_at = result, gen, gen.stats["steps"] + lag

    def is_ready(self) -> bool:
        return self._gen.stats["steps"] >= self._ready_at and self._result.is_ready()

    def __getattr__(self, name):
        return getattr(self._result, name)


def _lagging(gen: DVRGenerator, lag: int) -> DVRGenerator:
    launch = gen.verifier.launch

    def lagging(work, kv):
        launched = launch(work, kv)
        return LaunchedPass(launched.work, _DoneAfter(launched.result, gen, lag))

    gen.verifier.launch = lagging
    return gen


def _pct(values: list[int]) -> dict:
    if not values:
        return {"p50": None, "p90": None, "max": None}
    ordered = sorted(values)
    return {"p50": statistics.median(ordered), "p90": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
            "max": ordered[-1]}


def run(*, num_requests: int, share: float, lag: int, prompt_drafts: bool, seed: int = 0,
        order: str = "arrival", admission: str = "arrival") -> dict:
    cfg = ModelConfig(family="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                      num_kv_heads=1, head_dim=16, max_position_embeddings=1024, rms_norm_eps=1e-5,
                      rope=RopeConfig(theta=10000.0), eos_token_ids=(2,), bos_token_id=1)
    gen = _lagging(DVRGenerator(random_weights(cfg, seed=seed), cfg, window=8, group=4, max_num_seqs=64,
                                max_fast_tokens=256, max_canonical_tokens=128, kv_cache_tokens=64 * 700,
                                prompt_drafts=prompt_drafts,
                                scheduler=DefaultScheduler(order=order, admission=admission)), lag)
    workload = sharegpt_like(num_requests, length_scale=1 / 8, vocab_size=cfg.vocab_size, seed=seed)
    deterministic = set(deterministic_order(num_requests, seed=seed)[:round(share * num_requests)])
    rids, is_det = [], []
    for i, req in enumerate(workload.requests):
        det = i in deterministic
        params = SamplingParams(max_new_tokens=req.max_new_tokens, deterministic=det, ignore_eos=True,
                                temperature=req.temperature, seed=req.seed, logprobs=det)
        rids.append(gen.submit(list(req.prompt), params))
        is_det.append(det)
    first, finish, steps = {}, {}, 0
    started = time.perf_counter()
    while gen.has_unfinished():
        events = gen.step()
        steps += 1
        for rid in events:
            first.setdefault(rid, steps)
        for rid in rids:
            if rid not in finish and gen.is_finished(rid):
                finish[rid] = steps
    outputs = {rid: gen.result(rid) for rid in rids}
    det_rids = [r for r, d in zip(rids, is_det) if d]
    free_rids = [r for r, d in zip(rids, is_det) if not d]
    digest = hashlib.sha256(repr([(outputs[r].token_ids, outputs[r].logprobs) for r in det_rids]).encode())
    stats = gen.stats
    gen.close()
    return {
        "steps": steps, "host_s": round(time.perf_counter() - started, 2),
        "deterministic_first_token_step": _pct([first[r] for r in det_rids]),
        "deterministic_finish_step": _pct([finish[r] for r in det_rids]),
        "free_finish_step": _pct([finish[r] for r in free_rids]),
        "num_deterministic": len(det_rids),
        "prompt_draft_tokens": stats["prompt_draft_tokens"], "fast_tokens": stats["fast_tokens"],
        "canonical_passes": stats["canonical_passes"], "rollbacks": stats["rollbacks"],
        "ahead_tokens_kept": stats["ahead_tokens_kept"], "ahead_tokens_dropped": stats["ahead_tokens_dropped"],
        "deterministic_digest": digest.hexdigest(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/cpu_prompt_drafts.json"))
    ap.add_argument("--num-requests", type=int, default=200)
    ap.add_argument("--share", type=float, default=0.5)
    ap.add_argument("--lags", default="2,4")
    ap.add_argument("--orders", default="arrival")
    args = ap.parse_args()
    torch.set_num_threads(1)
    out = {"command": "python benchmarks/cpu_prompt_drafts.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out"), "cases": {}}
    for order in args.orders.split(","):
        for lag in (int(x) for x in args.lags.split(",")):
            case = {name: run(num_requests=args.num_requests, share=args.share, lag=lag, prompt_drafts=on, order=order)
                    for name, on in (("off", False), ("on", True))}
            case["same_bits"] = case["off"]["deterministic_digest"] == case["on"]["deterministic_digest"]
            out["cases"][f"lag_{lag}" + ("" if order == "arrival" else f"_{order}")] = case
            off, on = case["off"], case["on"]
            print(f"order {order}, lag {lag}: steps {off['steps']} -> {on['steps']}; det first token p50/p90 "
                  f"{off['deterministic_first_token_step']['p50']}/{off['deterministic_first_token_step']['p90']} -> "
                  f"{on['deterministic_first_token_step']['p50']}/{on['deterministic_first_token_step']['p90']}; det finish "
                  f"p50/max {off['deterministic_finish_step']['p50']}/{off['deterministic_finish_step']['max']} -> "
                  f"{on['deterministic_finish_step']['p50']}/{on['deterministic_finish_step']['max']}; prompt draft rows "
                  f"{on['prompt_draft_tokens']} of {on['fast_tokens']} fast tokens; same bits {case['same_bits']}",
                  flush=True)
    Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
