"""``FastPolicy(overlap_decode=True)``: a decode step cut in two halves, one half's attention beside the other
half's GEMMs (``model.forward.forward_layers_overlapped``). On the CPU the same schedule runs on one stream:

- ``StepInputs.split_decode`` cuts a decode step into two decode steps (rows, tables, the deterministic flags),
  and refuses what is not one, naming the field;
- each half gets exactly the bits (logits and K/V) ``forward`` gives that half alone; the overlapped schedule
  ran (a spy), and the control: a changed token in one half changes that half's rows only;
- only decode steps of at least ``overlap_min_rows`` rows are cut; prefill steps, small batches and a policy
  without the option run whole;
- the engine with it commits the default's deterministic outputs (the contract), with a control;
- bad options get an error naming the field.
The CUDA side (streams, graph capture): tests/gpu/test_decode_overlap_cuda.py.
"""

from __future__ import annotations

import importlib

import pytest
import torch

from llm42 import DVRGenerator, SamplingParams
from llm42.model import random_weights
from llm42.policies import FastPolicy
from tests.helpers import tiny_config, varlen_step, zero_kv, wide_config

forward_mod = importlib.import_module("llm42.model.forward")  # the module (llm42.model.forward is the function)
BLOCK_SIZE, BLOCKS_PER_SEQ = 8, 6
CFG = wide_config(hidden_size=128, max_position_embeddings=64)
WEIGHTS = random_weights(CFG, seed=11)
PROMPTS = [[(7 * s + 3 * i + 1) % CFG.vocab_size for i in range(3 + (5 * s) % 17)] for s in range(12)]  # halves of 6: the head's GEMM
# at 12 rows gives the last rows of each half other bits than at 6 (MKL), so the head runs per half


def _prefilled():
    kv = zero_kv(CFG, len(PROMPTS) * BLOCKS_PER_SEQ, BLOCK_SIZE)
    forward_mod.forward(WEIGHTS, CFG, varlen_step([(p, 0) for p in PROMPTS], BLOCKS_PER_SEQ, BLOCK_SIZE), kv,
                        FastPolicy())
    return kv


def _decode_step(tokens: list[int]):
    return varlen_step([([t], len(p)) for t, p in zip(tokens, PROMPTS)], BLOCKS_PER_SEQ, BLOCK_SIZE)


def _spy(monkeypatch) -> list[int]:
    calls = []
    real = forward_mod.forward_layers_overlapped

    def spy(weights, cfg, halves, *args):
        calls.append(tuple(h.num_rows for h in halves))
        return real(weights, cfg, halves, *args)

    monkeypatch.setattr(forward_mod, "forward_layers_overlapped", spy)
    return calls


def test_split_decode_cuts_a_decode_step_into_two_decode_steps():
    step = _decode_step(list(range(len(PROMPTS))))
    step = type(step)(**{**step.__dict__, "deterministic_rows": torch.tensor([1, 0, 0, 1, 0, 1, 1, 0, 0, 1, 1, 0],
                                                                              dtype=torch.int8)})
    first, second = step.split_decode(4)
    assert first.is_decode and second.is_decode
    assert (first.num_rows, second.num_rows) == (4, 8)
    assert first.seq_starts == (0, 1, 2, 3, 4) and second.seq_starts == tuple(range(9))
    assert torch.equal(second.row_seq, torch.arange(8))
    for name in ("token_ids", "positions", "slot_mapping", "block_tables", "context_lens", "deterministic_rows"):
        whole = getattr(step, name)
        assert torch.equal(torch.cat([getattr(first, name), getattr(second, name)]), whole), name
    assert first.max_context_len == second.max_context_len == step.max_context_len
    for at in (0, 12, -1):
        with pytest.raises(ValueError, match="at must be"):
            step.split_decode(at)
    prefill = varlen_step([(p, 0) for p in PROMPTS], BLOCKS_PER_SEQ, BLOCK_SIZE)
    with pytest.raises(ValueError, match="not a decode step"):
        prefill.split_decode(2)
    wanted = type(step)(**{**step.__dict__, "logits_rows": torch.arange(3)})
    with pytest.raises(ValueError, match="logits_rows"):
        wanted.split_decode(2)


def test_each_half_gets_the_bits_it_gets_alone_and_the_halves_are_independent(monkeypatch):
    calls = _spy(monkeypatch)
    tokens = [(13 * s + 2) % CFG.vocab_size for s in range(len(PROMPTS))]
    step = _decode_step(tokens)
    kv = _prefilled()
    overlapped = forward_mod.forward(WEIGHTS, CFG, step, kv, FastPolicy(overlap_decode=True, overlap_min_rows=2))
    assert calls == [(6, 6)]  # the schedule ran, halves of 6 rows
    alone_kv = _prefilled()
    first, second = step.split_decode(6)
    alone = torch.cat([forward_mod.forward(WEIGHTS, CFG, half, alone_kv, FastPolicy()) for half in (first, second)])
    assert torch.equal(overlapped, alone)
    for layer in range(CFG.num_layers):
        assert torch.equal(kv.k[layer], alone_kv.k[layer]) and torch.equal(kv.v[layer], alone_kv.v[layer])
    # the control: another token in the second half changes that half's rows, and only them
    changed = tokens[:8] + [(tokens[8] + 1) % CFG.vocab_size] + tokens[9:]
    other = forward_mod.forward(WEIGHTS, CFG, _decode_step(changed), _prefilled(),
                                FastPolicy(overlap_decode=True, overlap_min_rows=2))
    differs = [not torch.equal(other[r], overlapped[r]) for r in range(len(PROMPTS))]
    assert differs == [r == 8 for r in range(len(PROMPTS))]


def test_only_decode_steps_of_at_least_min_rows_are_cut(monkeypatch):
    calls = _spy(monkeypatch)
    tokens = list(range(1, len(PROMPTS) + 1))
    on = FastPolicy(overlap_decode=True, overlap_min_rows=12)
    forward_mod.forward(WEIGHTS, CFG, varlen_step([(p, 0) for p in PROMPTS], BLOCKS_PER_SEQ, BLOCK_SIZE),
                        zero_kv(CFG, len(PROMPTS) * BLOCKS_PER_SEQ, BLOCK_SIZE), on)  # a prefill step
    forward_mod.forward(WEIGHTS, CFG, _decode_step(tokens), _prefilled(), FastPolicy())  # the option off
    forward_mod.forward(WEIGHTS, CFG, _decode_step(tokens), _prefilled(),
                        FastPolicy(overlap_decode=True, overlap_min_rows=13))  # 12 rows < 13
    assert calls == []
    forward_mod.forward(WEIGHTS, CFG, _decode_step(tokens), _prefilled(), on)  # 12 rows >= 12
    assert calls == [(6, 6)]


def test_the_engine_with_overlapped_decode_commits_the_default_bits(monkeypatch):
    cfg = tiny_config(max_position_embeddings=256)
    weights = random_weights(cfg, seed=3)
    prompts = [[(5 * j + i) % cfg.vocab_size for i in range(2 + (3 * j) % 11)] for j in range(6)]
    params = [SamplingParams(max_new_tokens=12, temperature=0.9 if j % 2 else 0.0, seed=40 + j,
                             deterministic=j % 3 != 2, logprobs=True, ignore_eos=True) for j in range(6)]

    def run(fast_policy, params):
        with DVRGenerator(weights, cfg, window=4, group=2, kv_cache_tokens=1024, fast_policy=fast_policy) as gen:
            return [(c.token_ids, c.logprobs) for c in gen.generate(prompts, params)]

    calls = _spy(monkeypatch)
    overlapped = run(FastPolicy(overlap_decode=True, overlap_min_rows=2), params)
    assert calls and all(a + b >= 2 for a, b in calls)  # decode steps ran as halves
    default = run(None, params)
    det = [j for j in range(6) if params[j].deterministic]
    assert [overlapped[j] for j in det] == [default[j] for j in det]
    assert all(len(out[0]) == 12 for out in overlapped)
    # the control: other seeds commit other sampled outputs, so equal outputs above are not a constant
    reseeded = run(FastPolicy(overlap_decode=True, overlap_min_rows=2),
                   [SamplingParams(**{**p.__dict__, "seed": p.seed + 100}) for p in params])
    assert any(reseeded[j] != overlapped[j] for j in det if params[j].temperature > 0)


def test_bad_overlap_options_are_refused_naming_the_field():
    for bad in ("yes", 1, None):
        with pytest.raises(ValueError, match="overlap_decode"):
            FastPolicy(overlap_decode=bad)
    for bad in (1, 0, True, 2.5):
        with pytest.raises(ValueError, match="overlap_min_rows"):
            FastPolicy(overlap_decode=True, overlap_min_rows=bad)
    assert "overlap_decode=True, overlap_min_rows=64" in repr(FastPolicy(overlap_decode=True, overlap_min_rows=64))
    assert "overlap" not in repr(FastPolicy())
