"""Fixed vs adaptive speculation depth on the CPU, side by side in one run.

The embedded stories260K model, 6 deterministic prompts, a NoisyFastPolicy at
several noise scales (the stand-in for a fast path that drifts often). Reports
engine steps, fast steps, canonical passes, rollbacks and recomputed tokens —
counts, not timings — and checks both variants committed identical bits.

    PYTHONPATH=src python3 benchmarks/adaptive_draft_cpu.py --out benchmarks/results/adaptive_draft_cpu.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys

import torch

from llm42 import DVRGenerator, SamplingParams
from llm42.policies import NoisyFastPolicy

PROMPTS = ["Once upon a time", "The little dog", "Lily and Ben went", "One day, a cat", "Tom had a red ball",
           "The sun was"]
KEYS = ("steps", "fast_steps", "canonical_passes", "rollbacks", "recomputed_tokens", "committed_tokens")


def run(scale: float, adaptive: bool, window: int, group: int):
    gen = DVRGenerator.from_pretrained(window=window, group=group, adaptive_draft=adaptive,
                                       fast_policy=NoisyFastPolicy(scale=scale, seed=1))
    outs = gen.generate(PROMPTS, SamplingParams(max_new_tokens=96, deterministic=True, ignore_eos=True,
                                                logprobs=True))
    return [(o.token_ids, o.logprobs) for o in outs], {k: gen.stats[k] for k in KEYS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--group", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for scale in (0.0, 0.05, 0.15, 0.3):
        fixed_out, fixed = run(scale, False, args.window, args.group)
        adaptive_out, adaptive = run(scale, True, args.window, args.group)
        if fixed_out != adaptive_out:
            sys.exit(f"scale {scale}: fixed and adaptive committed different outputs")
        rows.append({"noise_scale": scale, "fixed": fixed, "adaptive": adaptive,
                     "steps_ratio": adaptive["steps"] / fixed["steps"]})
        print(f"noise {scale:4.2f}  steps {fixed['steps']:4d} -> {adaptive['steps']:4d}  "
              f"passes {fixed['canonical_passes']:3d} -> {adaptive['canonical_passes']:3d}  "
              f"recomputed {fixed['recomputed_tokens']:5d} -> {adaptive['recomputed_tokens']:4d}")
    result = {"command": "PYTHONPATH=src python3 " + shlex.join(sys.argv), "device": "cpu",
              "model": "stories260K (embedded)", "window": args.window, "group": args.group,
              "num_prompts": len(PROMPTS), "max_new_tokens": 96, "identical_outputs": True, "rows": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
