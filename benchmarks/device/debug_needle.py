"""Which part of the CUDA engine breaks the needle contract? Runs the GPU needle scenario under variations."""

import faulthandler
import json
import random
import sys
import time

faulthandler.dump_traceback_later(45, repeat=True)
T0 = time.time()

import torch

sys.path.insert(0, ".")
from llm42 import DVRGenerator, SamplingParams  # noqa: E402
from llm42.engine import prefill as prefill_mod  # noqa: E402
from llm42.model.config import llama31_8b_config  # noqa: E402
from llm42.model.weights import random_weights  # noqa: E402
from llm42.verify import canonical_pass as cp  # noqa: E402

cfg = llama31_8b_config(max_position_embeddings=2048, num_layers=int(sys.argv[1]) if len(sys.argv) > 1 else 32)
weights = random_weights(cfg, seed=0, dtype=torch.bfloat16, device="cuda", lm_head_std=0.2)
NEEDLES = {
    "greedy": SamplingParams(max_new_tokens=64, deterministic=True, logprobs=True, ignore_eos=True),
    "sampled": SamplingParams(max_new_tokens=64, temperature=0.8, top_p=0.95, seed=1234, deterministic=True,
                              logprobs=True, ignore_eos=True),
    "fast_only": SamplingParams(max_new_tokens=64, logprobs=True, ignore_eos=True),
}


def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def run(name, patch=None, **kwargs):
    undo = patch() if patch else None
    try:
        gen = DVRGenerator(weights, cfg, window=32, group=8, kv_cache_tokens=96 * 1024, **kwargs)
        rng = random.Random(42)
        needle = [rng.randrange(cfg.vocab_size) for _ in range(300)]
        alone = {}
        for n, p in NEEDLES.items():
            alone[n] = gen.generate([needle], [p])[0]
            print(f"  {name} alone {n} done at {time.time() - T0:.1f}s steps={gen.stats['steps']}", flush=True)
        result = {}
        for size in (3, 16):
            others = [([rng.randrange(cfg.vocab_size) for _ in range(rng.randint(4, 400))],
                       SamplingParams(max_new_tokens=rng.randint(1, 64), deterministic=rng.random() < 0.5,
                                      temperature=rng.choice([0.0, 0.8]), seed=rng.randrange(1000)))
                      for _ in range(size - 3)]
            reqs = [(p, s, None) for p, s in others]
            for n, p in NEEDLES.items():
                reqs.insert(rng.randint(0, len(reqs)), (needle, p, n))
            outs = gen.generate([r[0] for r in reqs], [r[1] for r in reqs])
            for (_, _, n), c in zip(reqs, outs):
                if n in ("greedy", "sampled"):
                    result[f"{n}@{size}"] = (first_diff(alone[n].token_ids, c.token_ids),
                                             first_diff(alone[n].logprobs, c.logprobs))
        result["stats"] = {k: gen.stats[k] for k in ("canonical_passes", "rollbacks", "prefix_cached_tokens")}
        print(name, json.dumps(result), flush=True)
        return result
    finally:
        if undo:
            undo()
        torch.cuda.empty_cache()


def sync_canonical():
    orig = cp.PassResult.is_ready

    def ready(self):
        if self._event is not None:
            self._event.synchronize()
        return True
    cp.PassResult.is_ready = ready
    return lambda: setattr(cp.PassResult, "is_ready", orig)


def no_fast_prefill():
    orig = prefill_mod.FastPrefill.can_run
    prefill_mod.FastPrefill.can_run = lambda self, a, b: False
    return lambda: setattr(prefill_mod.FastPrefill, "can_run", orig)


print(f"weights built at {time.time() - T0:.1f}s", flush=True)
report = {}
report["default"] = run("default")
report["no_fast_prefill"] = run("no_fast_prefill", no_fast_prefill)
report["overlap_off"] = run("overlap_off", overlap=False)
json.dump(report, open(sys.argv[2] if len(sys.argv) > 2 else "/tmp/debug.json", "w"), indent=1)
