"""``tune_decode_buckets`` on CUDA: every decode bucket timed, batches replayed on a larger bucket's graph, the same
committed bits.

``capture_graphs`` with the knob on times every bucket's graph (``FastStep.decode_bucket_times``) and sets the map
``cheapest_buckets`` gives. Whatever that map is on this card, the test then forces one that moves every batch of up
to 32 rows onto the 48-row graph (the mechanism, not the timing, is what can break the contract), checks that steps
replayed it (not vacuous), and that deterministic requests commit the bits of a generator without the knob.
"""

from __future__ import annotations

import random

import pytest

pytest.importorskip("triton")

from llm42 import DVRGenerator, SamplingParams  # noqa: E402
from llm42.cuda_graphs import cheapest_buckets  # noqa: E402

pytestmark = pytest.mark.gpu


def test_batches_replayed_on_a_larger_buckets_graph_commit_the_same_bits(llama8b, report):
    cfg, weights = llama8b
    rng = random.Random(5)
    prompts = [[rng.randrange(cfg.vocab_size) for _ in range(rng.randint(4, 64))] for _ in range(24)]
    params = [SamplingParams(max_new_tokens=rng.randint(8, 32), deterministic=i % 2 == 0, logprobs=True,
                             temperature=(0.0, 0.8)[i % 3 == 0], seed=i, ignore_eos=True) for i in range(24)]
    outputs = {}
    for tune in (False, True):
        gen = DVRGenerator(weights, cfg, max_num_seqs=48, max_fast_tokens=512, kv_cache_tokens=32 * 1024,
                           tune_decode_buckets=tune)
        gen.capture_graphs()
        graphs = gen.fast_step.decode_graphs
        replayed = []
        if tune:
            times = gen.fast_step.decode_bucket_times
            assert sorted(times) == list(graphs.buckets) and all(t > 0 for t in times.values())
            assert graphs.bucket_map == cheapest_buckets(times)
            report("decode_bucket_times_ms", {str(b): round(t, 4) for b, t in times.items()})
            with pytest.raises(ValueError, match="larger buckets"):
                graphs.set_bucket_map({48: 16})
            graphs.set_bucket_map({b: 48 for b in graphs.buckets if b <= 32})
            bucket_for = graphs.bucket_for

            def recorded(num_seqs: int) -> int:
                replayed.append(bucket_for(num_seqs))
                return replayed[-1]

            graphs.bucket_for = recorded
        done = gen.generate(prompts, params)
        gen.close()
        outputs[tune] = [(tuple(c.token_ids), tuple(c.logprobs)) for c, p in zip(done, params) if p.deterministic]
        if tune:
            assert replayed and set(replayed) <= {48}, sorted(set(replayed))  # every decode batch on the 48 graph
    assert outputs[True] == outputs[False]
