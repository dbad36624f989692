"""score() and update_weights() on CUDA, at the Llama-3.1-8B shape in bf16 (random weights).

- ``score`` gives the bits ``Completion.logprobs`` of a deterministic generation committed (raw and
  processed, greedy and sampled), scored alone, all together, and reversed among filler sequences,
  with the canonical pass replayed from its CUDA graph and run eagerly.
- After ``update_weights`` (captured graphs already replayed on the old weights) deterministic output
  equals that of a fresh generator built on the new weights.
"""

from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("triton")

from llm42 import DVRGenerator, SamplingParams  # noqa: E402
from llm42.model.weights import assemble, weight_views  # noqa: E402

pytestmark = pytest.mark.gpu

WINDOW, GROUP = 32, 8
KV_TOKENS = 32 * 1024


def hexes(values):
    return [v.hex() for v in values]


def make_generator(cfg, weights, **kwargs) -> DVRGenerator:
    return DVRGenerator(weights, cfg, window=WINDOW, group=GROUP, kv_cache_tokens=KV_TOKENS, **kwargs)


def requests(cfg, num: int, seed: int):
    rng = random.Random(seed)
    prompts = [[rng.randrange(cfg.vocab_size) for _ in range(rng.randrange(8, 200))] for _ in range(num)]
    params = [SamplingParams(max_new_tokens=rng.randrange(8, 48), temperature=rng.choice([0.0, 0.8, 1.0]),
                             top_k=rng.choice([0, 50]), top_p=rng.choice([1.0, 0.9]), seed=i, deterministic=True,
                             logprobs=rng.choice([True, 5]), logprobs_mode=rng.choice(["raw", "processed"]),
                             ignore_eos=True)
              for i in range(num)]
    return prompts, params


@pytest.mark.parametrize("use_cuda_graphs", [True, False])
def test_score_is_bit_identical_to_committed_logprobs_on_cuda(llama8b, use_cuda_graphs):
    cfg, weights = llama8b
    gen = make_generator(cfg, weights, use_cuda_graphs=use_cuda_graphs)
    prompts, params = requests(cfg, 12, seed=0)
    outs = gen.generate(prompts, params)
    completions = [o.token_ids for o in outs]
    together = gen.score(prompts, completions, params)
    alone = [gen.score([p], [c], [q])[0] for p, c, q in zip(prompts[:4], completions[:4], params[:4])]
    filler_prompts, filler_params = requests(cfg, 3, seed=1)
    order = list(range(len(prompts)))[::-1]
    mixed = gen.score([prompts[i] for i in order] + filler_prompts,
                      [completions[i] for i in order] + [[7] * 20] * 3,
                      [params[i] for i in order] + filler_params)
    mixed = {i: lps for i, lps in zip(order, mixed)}
    fresh = make_generator(cfg, weights, use_cuda_graphs=use_cuda_graphs).score(prompts, completions, params)
    for i, out in enumerate(outs):
        want = hexes(out.logprobs)
        assert hexes(together[i]) == want and hexes(mixed[i]) == want and hexes(fresh[i]) == want, i
        if i < len(alone):
            assert hexes(alone[i]) == want, i


def test_update_weights_on_cuda_equals_a_fresh_generator(llama8b):
    cfg, weights = llama8b
    own = assemble(cfg, {name: view.clone() for name, view in weight_views(cfg, weights).items()})
    gen = make_generator(cfg, own)
    prompts, params = requests(cfg, 6, seed=2)
    before = gen.generate(prompts, params)  # captures and replays the graphs on the old weights
    g = torch.Generator(device="cuda").manual_seed(3)
    new = {name: view + 0.1 * view.float().std() * torch.randn(view.shape, generator=g, device="cuda",
                                                                dtype=view.dtype)
           for name, view in weight_views(cfg, own).items()}
    gen.update_weights(new)
    after = gen.generate(prompts, params)
    reference = make_generator(cfg, assemble(cfg, new)).generate(prompts, params)
    for a, r in zip(after, reference):
        assert a.token_ids == r.token_ids and hexes(a.logprobs) == hexes(r.logprobs)
    assert any(hexes(a.logprobs) != hexes(b.logprobs) for a, b in zip(after, before))
