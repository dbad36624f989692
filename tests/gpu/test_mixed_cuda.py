"""Mixed fast steps on CUDA (decode rows and free prompt chunks in one pass: the CUDA default).

- The captured mixed step (decode rows gathered from the device state, prompt rows from the static rows,
  one forward, one sampler call, the decode state scattered) gives what the same step run eagerly at the
  bucket shapes gives, bit for bit, tokens, log-probs and the state it leaves.
- The engine serves free requests through mixed steps (``stats["mixed_steps"]``) and, with
  ``mixed_steps=False``, through two passes per step.
The contract with mixed steps (deterministic needles bit for bit in random batches) is
tests/gpu/test_engine_cuda.py's, which runs on the default.
"""

from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("triton")

from llm42 import DVRGenerator, KVStore, SamplingParams, cuda_graphs  # noqa: E402
from llm42.cuda_graphs import DecodeGraphs  # noqa: E402
from llm42.engine.decode_state import DecodeState  # noqa: E402
from llm42.engine.mixed import MixedStep  # noqa: E402
from llm42.engine.prefill import FastPrefill  # noqa: E402
from llm42.policies import FastPolicy  # noqa: E402
from llm42.runner import Segment  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("bucket_step", [None, 16])  # powers of two; every multiple of 16 (prompt rows 160, not 256)
def test_mixed_graph_replay_equals_the_eager_step_at_the_bucket_shapes(llama8b, bucket_step):
    cfg, weights = llama8b
    policy = FastPolicy()
    kv = KVStore(cfg, num_blocks=2048, block_size=16, num_scratch_slots=512, dtype=weights.dtype, device="cuda")
    state = DecodeState(weights, cfg, kv, policy, max_num_seqs=32)
    prefill = FastPrefill(weights, cfg, kv, policy, max_rows=512, max_seqs=8, use_graph=True,
                          bucket_step=bucket_step)
    mixed = MixedStep(state, prefill, DecodeGraphs(state, max_batch_size=32), use_graph=True,
                      bucket_step=bucket_step)
    rng = random.Random(4)
    num_decode = 16  # a decode bucket
    for rid in range(num_decode):
        length = rng.randint(1, 300)
        kv.allocate(rid, length)
        kv.append(rid, length)
        state.admit(rid, rid, SamplingParams(temperature=0.8) if rid % 2 else SamplingParams(), rid)
        state.set_next(rid, rng.randrange(cfg.vocab_size), length - 1)
    state.flush()
    segments = []
    for i in range(3):
        rid, length = 100 + i, rng.randint(20, 90)
        kv.allocate(rid, length + 1)
        kv.append(rid, length)
        prompt = tuple(rng.randrange(cfg.vocab_size) for _ in range(length))
        segments.append(Segment(rid, prompt, 0, SamplingParams(temperature=0.7, top_p=0.9), 7 + i))
    for layer in range(cfg.num_layers):  # random K/V, never zeros
        kv.layers().k[layer].normal_()
        kv.layers().v[layer].normal_()
    slots = list(range(num_decode))
    saved = state.snapshot()
    decode_variant = state.stage_batch(slots, mixed.decode_bucket(num_decode))
    replayed = [t.clone() for t in mixed.run(num_decode, decode_variant, 301, segments, kv)]
    after_replay = state.snapshot()
    assert mixed.graphs.num_captured == 1
    state.restore(saved)
    state.stage_batch(slots, num_decode)
    bucket, prompt_variant, _ = prefill.stage(segments, kv)
    num_prompt_rows = sum(len(seg.tokens) for seg in segments)
    power_of_two = 1 << max(4, (num_prompt_rows - 1).bit_length())
    assert bucket == (-(-num_prompt_rows // 16) * 16 if bucket_step == 16 else power_of_two), (bucket, num_prompt_rows)
    variant = mixed.variant(decode_variant, prompt_variant)
    # the graph sized attention from the model's context: give eager the same bound (None)
    eager = mixed.forward_sample(num_decode, bucket, variant=variant, max_context_len=None)
    assert torch.equal(replayed[0], eager[0]) and torch.equal(replayed[1], eager[1])
    assert torch.equal(replayed[2], eager[2][:3]) and torch.equal(replayed[3], eager[3][:3])
    assert all(torch.equal(a, b) for a, b in zip(after_replay, state.snapshot()))  # the same scatter
    assert len(set(replayed[0].tolist())) > 1


def _serve(llama8b, mixed_steps: bool | None):
    cfg, weights = llama8b
    rng = random.Random(0)
    prompts = [[rng.randrange(cfg.vocab_size) for _ in range(rng.randint(4, 300))] for _ in range(24)]
    params = [SamplingParams(max_new_tokens=rng.randint(4, 24), temperature=(0.0, 0.8)[i % 2],
                             top_p=(1.0, 0.9)[i % 3 == 0], seed=i, ignore_eos=True) for i in range(24)]
    gen = DVRGenerator(weights, cfg, max_num_seqs=8, max_fast_tokens=256, kv_cache_tokens=32 * 1024,
                       mixed_steps=mixed_steps)
    out = gen.generate(prompts, params)
    stats = dict(gen.stats)
    gen.close()
    assert [len(o.token_ids) for o in out] == [p.max_new_tokens for p in params]
    return stats


def test_a_linear_bucket_ladder_commits_the_same_deterministic_bits(llama8b):
    """``graph_bucket_step=48``: mixed and prompt graphs at 48, 96, 144, ... rows, not powers of two. The fast path's
    rows change (fewer padding rows); the deterministic requests' committed tokens and log-probs do not."""
    cfg, weights = llama8b
    rng = random.Random(7)
    needle = [rng.randrange(cfg.vocab_size) for _ in range(200)]
    det = [SamplingParams(max_new_tokens=40, deterministic=True, logprobs=True, ignore_eos=True),
           SamplingParams(max_new_tokens=40, temperature=0.8, top_p=0.9, seed=5, deterministic=True, logprobs=True,
                          ignore_eos=True)]
    alone_gen = DVRGenerator(weights, cfg, max_num_seqs=16, max_fast_tokens=512, kv_cache_tokens=64 * 1024)
    alone = [(tuple(o.token_ids), tuple(o.logprobs)) for o in (alone_gen.generate([needle], [p])[0] for p in det)]
    alone_gen.close()
    gen = DVRGenerator(weights, cfg, max_num_seqs=16, max_fast_tokens=512, kv_cache_tokens=64 * 1024,
                       graph_bucket_step=48)
    assert gen.fast_step.fast_prefill.graphs.buckets == (16, 32, 48, 96, 144, 192, 240, 288, 336, 384, 432, 480, 512)
    prompts = [[rng.randrange(cfg.vocab_size) for _ in range(rng.randint(30, 400))] for _ in range(20)]
    params = [SamplingParams(max_new_tokens=rng.randint(8, 40), temperature=(0.0, 0.8)[i % 2], seed=i,
                             ignore_eos=True) for i in range(20)]
    outs = gen.generate(prompts[:7] + [needle] + prompts[7:14] + [needle] + prompts[14:], params[:7] + [det[0]]
                        + params[7:14] + [det[1]] + params[14:])
    captured = {key[1] for key in gen.fast_step.mixed.graphs._graphs}  # prompt buckets the mixed steps ran
    stats = dict(gen.stats)
    gen.close()
    assert [(tuple(o.token_ids), tuple(o.logprobs)) for o in (outs[7], outs[15])] == alone
    assert stats["mixed_steps"] >= 3, stats
    assert captured - {16, 32, 512}, captured  # a step ran a bucket of the linear part of the ladder


def test_the_engine_serves_through_mixed_steps_by_default_on_cuda(llama8b):
    assert _serve(llama8b, None)["mixed_steps"] >= 5
    off = _serve(llama8b, False)
    assert off["mixed_steps"] == 0 and off["fast_steps"] > 0


def test_a_mixed_capture_out_of_memory_serves_on_with_two_passes_and_the_same_bits(llama8b, monkeypatch):
    """Round 53: the 8B shape's mixed graphs ran out of memory at capture. Here the first mixed capture runs its
    warm-up on the device and then raises ``torch.OutOfMemoryError``; the engine warns, drops the mixed step and
    serves every request to its end, the deterministic ones with the bits of an engine without mixed steps. The
    decode state the warm-up advanced is put back (``MixedGraphs.run``): without that, tokens would move.
    Control: the same requests with the capture left alone run mixed steps."""
    cfg, weights = llama8b
    rng = random.Random(3)
    prompts = [[rng.randrange(cfg.vocab_size) for _ in range(rng.randint(4, 300))] for _ in range(16)]
    params = [SamplingParams(max_new_tokens=rng.randint(4, 24), temperature=(0.0, 0.8)[i % 2], seed=i,
                             deterministic=i % 3 == 0, logprobs=True, ignore_eos=True) for i in range(16)]

    def serve(mixed_steps, fail):
        gen = DVRGenerator(weights, cfg, max_num_seqs=8, max_fast_tokens=256, kv_cache_tokens=32 * 1024,
                           mixed_steps=mixed_steps)
        if fail:
            pool, real = gen.fast_step.mixed.graphs._pool, cuda_graphs.capture_graph

            def failing(fn, graph_pool, **kwargs):
                if graph_pool is not pool:
                    return real(fn, graph_pool, **kwargs)
                fn()  # the warm-up run, on the device, advancing the decode state
                raise torch.OutOfMemoryError("CUDA out of memory (a test's stand-in)")

            monkeypatch.setattr(cuda_graphs, "capture_graph", failing)
        out = gen.generate(prompts, params)
        stats = dict(gen.stats)
        gen.close()
        monkeypatch.undo()
        assert [len(o.token_ids) for o in out] == [p.max_new_tokens for p in params]
        return [(tuple(o.token_ids), tuple(o.logprobs)) for o, p in zip(out, params) if p.deterministic], stats

    reference, _ = serve(False, False)
    with pytest.warns(RuntimeWarning, match="two passes"):
        dropped, stats = serve(None, True)
    assert stats["mixed_dropped"] == 1 and stats["mixed_steps"] == 0, stats
    assert dropped == reference
    kept, kept_stats = serve(None, False)
    assert kept_stats["mixed_steps"] > 0 and kept_stats["mixed_dropped"] == 0, kept_stats
    assert kept == reference
