"""``FastPolicy(overlap_decode=True)`` on CUDA, at the Llama-3.1-8B shape in bf16 (random weights): one half's
decode attention on a second stream beside the other half's GEMMs.

- The overlapped step, eager and replayed from a CUDA graph (the second stream captured into it), gives each
  half the logits and K/V bits that half gets alone: no stream race (a half's attention reading K/V its K/V write
  has not made, an output read before it is written) shows as a bit. Replayed many times with other work queued,
  always the same bits. The control: the halves alone at another split point give other bits somewhere, so the
  comparison sees which rows ran together.
- The engine with it (decode graphs captured with the overlap) commits the default's deterministic outputs.
"""

from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("triton")

from llm42 import DVRGenerator, SamplingParams  # noqa: E402
from llm42.cuda_graphs import capture_graph  # noqa: E402
from llm42.inputs import StepInputs  # noqa: E402
from llm42.model.forward import KVLayers, forward  # noqa: E402
from llm42.policies import FastPolicy  # noqa: E402

pytestmark = pytest.mark.gpu

PAGE = 16
OVERLAP = FastPolicy(overlap_decode=True, overlap_min_rows=2)


def _decode_step(cfg, num_seqs: int, seed: int) -> tuple[StepInputs, KVLayers]:
    g = torch.Generator().manual_seed(seed)
    contexts = torch.randint(16, 900, (num_seqs,), generator=g)
    max_blocks = -(-int(contexts.max()) // PAGE)
    tables = torch.randperm(num_seqs * max_blocks, generator=g).view(num_seqs, max_blocks)
    positions = contexts - 1
    slots = tables.gather(1, (positions // PAGE).unsqueeze(1)).squeeze(1) * PAGE + positions % PAGE
    n = num_seqs * max_blocks * PAGE
    kv = KVLayers([torch.randn(n, cfg.num_kv_heads, cfg.head_dim, generator=g).to("cuda", torch.bfloat16)
                   for _ in range(cfg.num_layers)],
                  [torch.randn(n, cfg.num_kv_heads, cfg.head_dim, generator=g).to("cuda", torch.bfloat16)
                   for _ in range(cfg.num_layers)], PAGE)
    inputs = StepInputs(
        token_ids=torch.randint(0, cfg.vocab_size, (num_seqs,), generator=g).cuda(), positions=positions.cuda(),
        slot_mapping=slots.cuda(), row_seq=torch.arange(num_seqs, device="cuda"), block_tables=tables.cuda(),
        context_lens=contexts.cuda(), seq_starts=tuple(range(num_seqs + 1)), max_context_len=int(contexts.max()),
    )
    return inputs, kv


def _halves_alone(weights, cfg, inputs: StepInputs, kv: KVLayers, at: int) -> torch.Tensor:
    return torch.cat([forward(weights, cfg, half, kv, FastPolicy()) for half in inputs.split_decode(at)])


def _kv_copy(kv: KVLayers) -> list[torch.Tensor]:
    return [t.clone() for t in kv.k + kv.v]


def test_overlapped_decode_gives_each_half_its_own_bits_eager_and_replayed(llama8b, report):
    cfg, weights = llama8b
    num_seqs = 256
    inputs, kv = _decode_step(cfg, num_seqs, seed=1)
    alone = _halves_alone(weights, cfg, inputs, kv, num_seqs // 2)
    alone_kv = _kv_copy(kv)
    eager = forward(weights, cfg, inputs, kv, OVERLAP)
    assert torch.equal(eager, alone)
    assert all(torch.equal(a, b) for a, b in zip(_kv_copy(kv), alone_kv))
    graph, static = capture_graph(lambda: forward(weights, cfg, inputs, kv, OVERLAP), torch.cuda.graph_pool_handle())
    busy = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    for rep in range(20):
        static.zero_()
        busy @ busy  # other work queued ahead of the replay
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static, alone), f"replay {rep}"
    assert all(torch.equal(a, b) for a, b in zip(_kv_copy(kv), alone_kv))
    # the control: split elsewhere, the GEMMs run other row sets and some row gets other bits
    other = _halves_alone(weights, cfg, inputs, kv, num_seqs // 2 - 40)
    differing = int((other != alone).any(dim=-1).sum())
    report("overlap_rows_differing_at_another_split", differing)
    assert differing > 0


def test_engine_with_overlapped_decode_commits_the_default_bits(llama8b, report):
    cfg, weights = llama8b
    rng = random.Random(7)
    prompts = [[rng.randrange(cfg.vocab_size) for _ in range(rng.randint(8, 200))] for _ in range(40)]
    params = [SamplingParams(max_new_tokens=32, temperature=0.8 if j % 2 else 0.0, seed=j, deterministic=j % 4 != 3,
                             logprobs=True, ignore_eos=True) for j in range(40)]

    def run(fast_policy):
        gen = DVRGenerator(weights, cfg, window=32, group=8, kv_cache_tokens=64 * 1024, fast_policy=fast_policy)
        try:
            outs = gen.generate(prompts, params)
            return [(tuple(c.token_ids), tuple(c.logprobs)) for c in outs], dict(gen.stats)
        finally:
            gen.close()

    overlapped, stats = run(FastPolicy(overlap_decode=True, overlap_min_rows=16))
    default, _ = run(None)
    det = [j for j in range(40) if params[j].deterministic]
    assert [overlapped[j] for j in det] == [default[j] for j in det]
    report("overlap_engine_stats", stats)
    free = [j for j in range(40) if not params[j].deterministic]
    assert all(len(overlapped[j][0]) == 32 for j in free)
