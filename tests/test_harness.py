"""llm42.testing.harness, the random-batch harness of `llm42 check` / `llm42 demo`, used directly."""

from __future__ import annotations

import random

from llm42 import DVRGenerator, SamplingParams
from llm42.policies import NoisyFastPolicy
from llm42.testing.harness import filler_prompts, random_batch, run_random_batches, stat_line


def test_random_batches_keep_deterministic_requests_equal_to_their_references_under_a_noisy_fast_path():
    targets = [("Once upon a time", SamplingParams(max_new_tokens=8, deterministic=True, logprobs=True)),
               ([1, 400, 401], SamplingParams(max_new_tokens=6, temperature=0.9, seed=3, deterministic=True))]
    reference_gen = DVRGenerator.from_pretrained(window=4, group=2)
    references = [reference_gen.generate([p], params)[0] for p, params in targets]
    gen = DVRGenerator.from_pretrained(window=4, group=2, fast_policy=NoisyFastPolicy(scale=1.0, seed=0))
    fillers = filler_prompts(random.Random(0), gen)
    outcomes = list(run_random_batches(gen, targets, references, fillers, num_batches=2, seed=1))
    assert [o.index for o in outcomes] == [0, 1]
    assert all(not o.divergences for o in outcomes)
    assert sum(o.stats_delta["rollbacks"] for o in outcomes) > 0  # the noise was real, and repaired
    assert "rollbacks=" in stat_line(gen.stats)


def test_a_random_batch_holds_every_target_once_plus_two_to_eight_fillers():
    targets = [([1, 2], SamplingParams(deterministic=True)), ([1, 3], SamplingParams(deterministic=True))]
    batch = random_batch(random.Random(5), targets, [[7, 8, 9]], max_context=64)
    assert sorted(t for t in batch.targets if t is not None) == [0, 1]
    assert 2 <= batch.num_free <= 8 and len(batch.schedule) == len(batch.prompts)
    assert all(not p.deterministic for p, t in zip(batch.params, batch.targets) if t is None)
