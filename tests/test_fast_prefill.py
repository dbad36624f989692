"""The fast path's static-buffer prefill (the layout CUDA replays from graphs) computes what the varlen path does."""

import torch

from llm42 import KVStore, SamplingParams
from llm42.engine.prefill import FastPrefill
from llm42.model.weights import random_weights
from llm42.policies import FastPolicy
from llm42.runner import ModelRunner, Segment
from tests.helpers import tiny_config

CFG = tiny_config()
WEIGHTS = random_weights(CFG, seed=3)


def _run_both(prompts, params):
    results = []
    for use_static in (False, True):
        kv = KVStore(CFG, num_blocks=64, block_size=8, num_scratch_slots=64)
        segments = []
        for rid, (prompt, p) in enumerate(zip(prompts, params)):
            kv.allocate(rid, len(prompt) + 1)
            kv.append(rid, len(prompt))
            segments.append(Segment(rid, tuple(prompt), 0, p, 11 + rid))
        if use_static:
            tokens, logprobs = FastPrefill(WEIGHTS, CFG, kv, FastPolicy(), max_rows=64, max_seqs=4,
                                           use_graph=False).run(segments, kv)
        else:
            runner = ModelRunner(WEIGHTS, CFG)
            rows = runner.sampling_rows([(s.params, s.seed, s.end) for s in segments], len(segments))
            tokens, logprobs = runner.forward_sample(runner.fast_inputs(segments, kv), kv, FastPolicy(), rows)
        slots = torch.tensor([s for rid, p in enumerate(prompts) for s in kv.slots(rid, 0, len(p))])
        results.append((tokens, logprobs, kv.layers().k[1][slots].clone()))
    return results


def test_static_prefill_matches_the_varlen_path():
    prompts = [[5, 9, 14, 3, 7], [7, 7, 8], list(range(20, 45))]
    params = [SamplingParams(), SamplingParams(temperature=0.8, top_k=20, seed=1), SamplingParams()]
    (tok_a, lp_a, kv_a), (tok_b, lp_b, kv_b) = _run_both(prompts, params)
    assert torch.equal(tok_a, tok_b)
    torch.testing.assert_close(lp_a, lp_b, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(kv_a, kv_b, rtol=1e-5, atol=1e-6)
    assert not torch.equal(kv_a, torch.zeros_like(kv_a))  # the static path really wrote the prompt's K/V


def test_static_prefill_pads_to_more_sequences_than_it_gets():
    (tok_a, _, _), (tok_b, _, _) = _run_both([[1, 2, 3]], [SamplingParams()])
    assert tok_a.shape == tok_b.shape == (1,) and torch.equal(tok_a, tok_b)
