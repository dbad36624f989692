"""What the order of service and of admission change in engine steps, with canonical passes that take several steps.

    PYTHONPATH=src python3 benchmarks/cpu_order_admission.py [--out benchmarks/results/cpu_order_admission.json]
        [--num-requests 200] [--share 0.5] [--lags 2,4]

The step model of ``benchmarks/cpu_prompt_drafts.py`` (round 30: every request submitted at step 0, ShareGPT-like
lengths scaled by 1/8, a one-layer model, 64 seats for the requests, each canonical pass reported done ``lag`` engine
steps after its launch), run with ``DefaultScheduler(order=, admission=)`` for each pair of ``"arrival"`` and
``"budget"``. Round 32 served ``order="budget"`` on an H100 (SmolLM2's dvr@50 0.83-0.88 of nondet against the
default's 0.65-0.68); its runs still ended on long replies admitted last, which ``admission="budget"`` admits
first. Reported, in engine steps: the run's length, the deterministic and free requests' finish (p50 / p90 / max),
the deterministic first token; every case's deterministic outputs must be identical (``same_bits``).

What it cannot say: how much a step costs (more requests with long budgets at once make longer steps on a device),
nor anything about online arrivals. The device A/B is ``benchmarks/device/r33_call_b.sh``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("cpu_prompt_drafts", REPO / "benchmarks" / "cpu_prompt_drafts.py")
step_model = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(step_model)

PAIRS = (("arrival", "arrival"), ("budget", "arrival"), ("arrival", "budget"), ("budget", "budget"))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/cpu_order_admission.json"))
    ap.add_argument("--num-requests", type=int, default=200)
    ap.add_argument("--share", type=float, default=0.5)
    ap.add_argument("--lags", default="2,4")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    out = {"command": "python benchmarks/cpu_order_admission.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out"), "cases": {}}
    digests = set()
    for lag in (int(x) for x in args.lags.split(",")):
        for order, admission in PAIRS:
            got = step_model.run(num_requests=args.num_requests, share=args.share, lag=lag, prompt_drafts=False,
                                 order=order, admission=admission)
            digests.add(got["deterministic_digest"])
            out["cases"][f"lag_{lag}_order_{order}_admission_{admission}"] = got
            print(f"lag {lag}, order {order}, admission {admission}: steps {got['steps']}; det first token "
                  f"p50/p90 {got['deterministic_first_token_step']['p50']}/"
                  f"{got['deterministic_first_token_step']['p90']}; det finish p50/max "
                  f"{got['deterministic_finish_step']['p50']}/{got['deterministic_finish_step']['max']}; free finish "
                  f"max {got['free_finish_step']['max']}", flush=True)
    out["same_bits"] = len(digests) == 1
    print(f"same bits in every case: {out['same_bits']}")
    Path(args.out).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
