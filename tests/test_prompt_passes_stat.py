"""``stats["prompt_passes"]``: the canonical passes that carried a deterministic prompt's chunk (round 40), counted
against what each launch actually held (``record_launches``): a pass with a chunk counts, a verify-only pass does
not, and both kinds occur (the count is neither 0 nor every pass)."""

from __future__ import annotations

import random

from llm42 import DVRGenerator, SamplingParams
from llm42.model.weights import random_weights
from tests.helpers import record_launches, serve, tiny_config

CFG = tiny_config()
WEIGHTS = random_weights(CFG, seed=5)


def test_prompt_passes_count_the_launches_that_carried_a_prompt_chunk():
    gen = DVRGenerator(WEIGHTS, CFG, window=4, group=2, kv_cache_tokens=4096)
    carried = record_launches(gen, lambda work: any(w.is_prefill for w in work))
    rng = random.Random(2)
    prompts = [[rng.randrange(3, CFG.vocab_size) for _ in range(rng.randint(2, 20))] for _ in range(6)]
    params = [SamplingParams(max_new_tokens=12, deterministic=i % 2 == 0, ignore_eos=True, temperature=0.8, seed=i)
              for i in range(6)]
    serve(gen, prompts, params)
    stats = gen.stats
    assert stats["canonical_passes"] == len(carried)
    assert stats["prompt_passes"] == sum(carried)
    assert 0 < stats["prompt_passes"] < stats["canonical_passes"]  # not vacuous: both kinds of pass ran
