"""``DVRGenerator.capture_graphs`` on CUDA: every graph before serving, none while serving, the same bits.

A generator that captured up front serves a mix of free and deterministic requests (greedy and sampled, prompts of
many lengths: decode buckets, prompt buckets and mixed steps) without one capture; the same requests on a generator
that did not (the negative control) capture lazily, mid-serving, and the two commit the same deterministic bits.
The lazy captures' count and seconds are reported (what ``llm42 serve`` spares its requests at start-up).
"""

from __future__ import annotations

import random
import time

import pytest
import torch

pytest.importorskip("triton")

from llm42 import DVRGenerator, SamplingParams  # noqa: E402
from llm42 import cuda_graphs  # noqa: E402
from llm42.verify import canonical_pass  # noqa: E402

pytestmark = pytest.mark.gpu


def _requests(cfg):
    rng = random.Random(11)
    prompts = [[rng.randrange(cfg.vocab_size) for _ in range(rng.randint(4, 400))] for _ in range(40)]
    params = [SamplingParams(max_new_tokens=rng.randint(4, 40), deterministic=i % 3 == 0, logprobs=True,
                             temperature=(0.0, 0.8)[i % 2], top_p=(1.0, 0.9)[i % 5 == 0], seed=i, ignore_eos=True)
              for i in range(40)]
    return prompts, params


def _counting_captures(monkeypatch) -> list[float]:
    """Every capture from now on appends its seconds to the returned list."""
    seconds: list[float] = []
    real = cuda_graphs.capture_graph

    def counted(*args, **kwargs):
        start = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            torch.cuda.synchronize()
            seconds.append(time.perf_counter() - start)

    monkeypatch.setattr(cuda_graphs, "capture_graph", counted)
    monkeypatch.setattr(canonical_pass, "capture_graph", counted)
    return seconds


def test_captured_up_front_nothing_is_captured_while_serving_and_the_bits_are_the_same(llama8b, monkeypatch,
                                                                                       report):
    cfg, weights = llama8b
    prompts, params = _requests(cfg)
    outputs, lazy = {}, {}
    for up_front in (True, False):
        gen = DVRGenerator(weights, cfg, max_num_seqs=16, max_fast_tokens=512, kv_cache_tokens=64 * 1024)
        counts = gen.capture_graphs() if up_front else None
        seconds = _counting_captures(monkeypatch)
        start = time.perf_counter()
        done = gen.generate(prompts, params)
        serve_s = time.perf_counter() - start
        stats = dict(gen.stats)
        gen.close()
        monkeypatch.undo()
        outputs[up_front] = [(tuple(c.token_ids), tuple(c.logprobs)) for c, p in zip(done, params) if p.deterministic]
        lazy[up_front] = {"captures": len(seconds), "capture_s": round(sum(seconds), 3), "serve_s": round(serve_s, 3),
                          "counts": counts}
        assert stats["mixed_steps"] > 0 and stats["canonical_passes"] > 0  # not vacuous: every kind of step ran
        if up_front:
            assert all(n > 0 for n in counts.values()), counts
    report("capture_graphs_cuda", lazy)
    assert lazy[True]["captures"] == 0, lazy
    assert lazy[False]["captures"] > 0, lazy  # the negative control: without it, steps capture mid-serving
    assert outputs[True] == outputs[False]
