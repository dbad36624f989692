"""A checkpoint whose config says 131,072 positions: everything sized by context follows max_model_len.

The checkpoint is tiny (hidden 64, 2 layers) but its config.json is Llama-3.1's context and RoPE
(llama3 scaling). Nothing the engine keeps may be sized to the 131,072 positions where a request
needs fewer (the host computes the full RoPE table once, transiently, and keeps max_model_len rows
of it), the RoPE rows are the full table's, and the knob never changes a committed bit.
"""

from __future__ import annotations

import dataclasses
import json
import random

import pytest
import torch
from safetensors.torch import save_file

import llm42.model.weights
from llm42 import DVRGenerator, SamplingParams
from llm42.model import load_config
from llm42.model.config import RopeConfig
from llm42.model.weights import hf_tensor_shapes, rope_tables

CONTEXT = 131072
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": CONTEXT,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192},
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
WINDOW, GROUP = 32, 8  # R = 256 rows: a long prompt's canonical prefill in few passes
LONG_PROMPT_TOKENS = 2100  # past the CPU K/V default's 2048-token floor
DETERMINISTIC = SamplingParams(max_new_tokens=8, deterministic=True, logprobs=True, ignore_eos=True)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("llama31_context")
    (directory / "config.json").write_text(json.dumps(CONFIG))
    generator = torch.Generator().manual_seed(0)
    cfg = load_config(directory)
    tensors = {name: torch.randn(shape, generator=generator) * 0.1 for name, shape in hf_tensor_shapes(cfg).items()}
    save_file(tensors, str(directory / "model.safetensors"))
    return directory


@pytest.fixture(scope="module")
def full_rope(checkpoint) -> tuple[torch.Tensor, torch.Tensor]:
    return rope_tables(load_config(checkpoint), "cpu")


def load(checkpoint, **kwargs) -> DVRGenerator:
    return DVRGenerator.from_pretrained(checkpoint, window=WINDOW, group=GROUP, max_num_seqs=8, **kwargs)


def random_prompt(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, CONFIG["vocab_size"]) for _ in range(length)]


def bits(completion) -> tuple[list[int], list[str]]:
    return completion.token_ids, [lp.hex() for lp in completion.logprobs]


def assert_sized_to(gen: DVRGenerator, max_model_len: int, full_rope) -> None:
    """Every table is sized to ``max_model_len``, and the RoPE rows hold the full table's values."""
    max_blocks = -(-max_model_len // gen.kv.block_size)
    assert gen.max_model_len == max_model_len
    assert torch.equal(gen.weights.rope_cos, full_rope[0][:max_model_len])
    assert torch.equal(gen.weights.rope_sin, full_rope[1][:max_model_len])
    assert gen.decode_state.tables.shape[1] == max_blocks
    assert gen.fast_step.fast_prefill._rows.block_tables.shape[1] == max_blocks
    gen.generate([[1, 5, 9]], SamplingParams(max_new_tokens=2, deterministic=True))  # binds the canonical pass
    assert gen.verifier.canonical_pass._rows.block_tables.shape[1] == max_blocks


# -- RoPE tables --------------------------------------------------------------------------------------
def test_rope_tables_of_fewer_rows_equal_the_full_table_at_every_position(checkpoint, full_rope):
    cfg = load_config(checkpoint)
    full_cos, full_sin = full_rope
    assert full_cos.shape == (CONTEXT, cfg.head_dim)
    for rows in (1, 7, 4095, 4096, 32768 + 5):
        cos, sin = rope_tables(cfg, "cpu", rows)
        assert torch.equal(cos, full_cos[:rows]) and torch.equal(sin, full_sin[:rows]), rows
    # negative control: the comparison sees the formula (plain RoPE of the same theta differs)
    plain = dataclasses.replace(cfg, rope=RopeConfig(theta=500000.0))
    assert not torch.equal(rope_tables(plain, "cpu", 4096)[0], full_cos[:4096])


def test_loading_with_max_model_len_keeps_only_that_many_rope_rows(checkpoint, monkeypatch):
    rows = []
    original = llm42.model.weights.rope_tables

    def recording(cfg, device, num_positions=None):
        cos, sin = original(cfg, device, num_positions)
        rows.append(cos.shape[0])
        return cos, sin

    monkeypatch.setattr(llm42.model.weights, "rope_tables", recording)
    load(checkpoint, max_model_len=4096)
    assert rows == [4096]
    # negative control: without the knob the loader builds the checkpoint's whole table
    rows.clear()
    load(checkpoint)
    assert rows[0] == CONTEXT


# -- sizes ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("max_model_len", [2048, 8192])
def test_tables_and_kv_default_follow_max_model_len_not_the_config(checkpoint, full_rope, max_model_len):
    gen = load(checkpoint, max_model_len=max_model_len)
    assert_sized_to(gen, max_model_len, full_rope)
    capacity = gen.kv.num_blocks * gen.kv.block_size
    assert max_model_len <= capacity <= 16 * max_model_len  # the CPU default: up to 16 such requests


def test_default_max_model_len_is_the_context_capped_by_the_kv_store(checkpoint, full_rope):
    gen = load(checkpoint)
    capacity = gen.kv.num_blocks * gen.kv.block_size
    assert capacity < CONTEXT  # the CPU default store (64K tokens) cannot hold a whole context
    assert_sized_to(gen, capacity, full_rope)
    small = load(checkpoint, kv_cache_tokens=3000)
    assert small.max_model_len == small.kv.num_blocks * small.kv.block_size == 3008


def test_max_model_len_equal_to_the_context_is_accepted(checkpoint, full_rope):
    # negative control for the bound below: the context itself is allowed
    gen = load(checkpoint, max_model_len=CONTEXT, kv_cache_tokens=CONTEXT, max_fast_tokens=16)
    assert gen.max_model_len == CONTEXT and torch.equal(gen.weights.rope_cos, full_rope[0])


# -- bad values -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "error"),
    [(0, ValueError), (-1, ValueError), (True, TypeError), ("4096", TypeError), (4096.0, TypeError),
     (CONTEXT + 1, ValueError)],
)
def test_bad_max_model_len_raises_naming_the_field(checkpoint, value, error):
    with pytest.raises(error, match="max_model_len"):
        load(checkpoint, max_model_len=value)


def test_max_model_len_beyond_the_kv_store_is_refused_at_construction(checkpoint):
    with pytest.raises(ValueError, match="max_model_len .*kv_cache_tokens"):
        load(checkpoint, max_model_len=2048, kv_cache_tokens=1024)


# -- admission and committed bits -----------------------------------------------------------------------
def test_a_request_past_max_model_len_is_refused_and_one_at_it_runs(checkpoint):
    gen = load(checkpoint, max_model_len=256)
    prompt = random_prompt(1, 250)
    with pytest.raises(ValueError, match=r"max_new_tokens \(7\) exceeds max_model_len, 256 tokens"):
        gen.submit(prompt, SamplingParams(max_new_tokens=7))
    out = gen.generate([prompt], SamplingParams(max_new_tokens=6, deterministic=True, ignore_eos=True))[0]
    assert len(out.token_ids) == 6 and out.finish_reason == "length"


def test_a_request_at_the_limit_commits_the_same_bits_alone_batched_and_at_a_larger_max_model_len(checkpoint):
    prompt = random_prompt(2, 250)
    params = SamplingParams(max_new_tokens=6, deterministic=True, logprobs=True, ignore_eos=True)
    alone = load(checkpoint, max_model_len=256, prefix_cache=False).generate([prompt], params)[0]
    others = [random_prompt(seed, 40 + seed) for seed in range(3, 7)]
    batched = load(checkpoint, max_model_len=256, prefix_cache=False).generate(
        [*others[:2], prompt, *others[2:]], [SamplingParams(max_new_tokens=5)] * 2 + [params]
        + [SamplingParams(max_new_tokens=5, deterministic=True)] * 2)[2]
    larger = load(checkpoint, max_model_len=320, prefix_cache=False).generate([prompt], params)[0]
    assert bits(batched) == bits(alone) and bits(larger) == bits(alone)
    # negative control: the comparison sees the prompt's first position
    changed = load(checkpoint, max_model_len=256, prefix_cache=False).generate([[7] + prompt[1:]], params)[0]
    assert bits(changed) != bits(alone)


def test_a_long_prompt_commits_the_same_bits_alone_and_batched_under_another_max_model_len(checkpoint):
    """One comparison for two claims (a long canonical prefill costs seconds on the CPU): the request
    alone under max_model_len=4096 and inside a batch under max_model_len=8192."""
    prompt = random_prompt(0, LONG_PROMPT_TOKENS)
    alone = load(checkpoint, max_model_len=4096, prefix_cache=False).generate([prompt], DETERMINISTIC)[0]

    gen = load(checkpoint, max_model_len=8192, prefix_cache=False)
    free = [gen.submit(random_prompt(seed, 30), SamplingParams(max_new_tokens=12)) for seed in (10, 11)]
    target = gen.submit(prompt, DETERMINISTIC)
    gen.step()
    other = gen.submit(random_prompt(12, 300), SamplingParams(max_new_tokens=6, deterministic=True))
    while gen.has_unfinished():
        gen.step()
    assert all(gen.is_finished(rid) for rid in (*free, other))
    batched = gen.result(target)
    assert len(alone.token_ids) == DETERMINISTIC.max_new_tokens
    assert bits(batched) == bits(alone)
    # negative control: the prompt's first position reaches the output (free requests: fast, no canonical
    # prefill), so a table that dropped or misread early positions would show in the comparison
    free_params = SamplingParams(max_new_tokens=4, logprobs=True, ignore_eos=True)
    first, changed = gen.generate([prompt, [7] + prompt[1:]], free_params)
    assert bits(first) != bits(changed)
