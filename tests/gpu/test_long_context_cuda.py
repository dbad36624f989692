"""Issue 12 item 4 on CUDA: a checkpoint whose config says 131,072 positions, served with max_model_len.

The checkpoint is small (hidden 512, 4 layers) so that it loads in a second, but its config.json
is Llama-3.1's context and RoPE. With ``max_model_len=40960`` and CUDA graphs on, nothing the
engine keeps on the device may be sized to the 131,072 positions (RoPE tables, the decode
state's, fast prefill's and canonical pass's block tables, the K/V default), a 32,768-token
prompt is served free and deterministic, and the deterministic one commits the same bits alone
and next to other requests (negative control: a changed first token changes them).
"""

from __future__ import annotations

import json
import random

import pytest
import torch
from safetensors.torch import save_file

from llm42 import DVRGenerator, SamplingParams
from llm42.model import load_config
from llm42.model.weights import hf_tensor_shapes

pytestmark = pytest.mark.gpu

CONTEXT = 131072
MAX_MODEL_LEN = 40960
PROMPT_TOKENS = 32768
CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 4096, "hidden_size": 512,
    "intermediate_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
    "max_position_embeddings": CONTEXT, "rms_norm_eps": 1e-5, "hidden_act": "silu", "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192},
    "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16",
}
DET = SamplingParams(max_new_tokens=4, deterministic=True, logprobs=True, ignore_eos=True)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    directory = tmp_path_factory.mktemp("llama31_context_cuda")
    (directory / "config.json").write_text(json.dumps(CONFIG))
    generator = torch.Generator().manual_seed(0)
    cfg = load_config(directory)
    tensors = {name: (torch.randn(shape, generator=generator) * 0.05).to(torch.bfloat16)
               for name, shape in hf_tensor_shapes(cfg).items()}
    save_file(tensors, str(directory / "model.safetensors"))
    return directory


def _prompt(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, CONFIG["vocab_size"]) for _ in range(length)]


def _bits(completion) -> tuple[list[int], list[str]]:
    return completion.token_ids, [lp.hex() for lp in completion.logprobs]


def _load(checkpoint) -> DVRGenerator:
    return DVRGenerator.from_pretrained(checkpoint, device="cuda", dtype=torch.bfloat16, window=32, group=8,
                                        max_num_seqs=8, max_model_len=MAX_MODEL_LEN, prefix_cache=False)


def test_a_131k_config_serves_a_32k_prompt_sized_to_max_model_len(checkpoint, report):
    gen = _load(checkpoint)
    max_blocks = -(-MAX_MODEL_LEN // gen.kv.block_size)
    assert gen.max_model_len == MAX_MODEL_LEN
    assert gen.weights.rope_cos.shape[0] == MAX_MODEL_LEN and gen.weights.rope_cos.device.type == gen.device.type
    assert gen.decode_state.tables.shape[1] == max_blocks
    assert gen.fast_step.fast_prefill._rows.block_tables.shape[1] == max_blocks
    capacity = gen.kv.num_blocks * gen.kv.block_size
    assert MAX_MODEL_LEN <= capacity <= 8 * MAX_MODEL_LEN + gen.kv.block_size * 8, capacity
    prompt = _prompt(0, PROMPT_TOKENS)
    free = gen.generate([prompt], SamplingParams(max_new_tokens=4, ignore_eos=True))[0]
    assert len(free.token_ids) == 4
    alone = gen.generate([prompt], DET)[0]
    assert gen.verifier.canonical_pass._rows.block_tables.shape[1] == max_blocks
    assert gen.fast_step.decode_graphs is not None
    report("long_context_cuda_rope_rows", int(gen.weights.rope_cos.shape[0]))
    report("long_context_cuda_kv_capacity_tokens", capacity)

    # the same bits next to other requests, free and deterministic, on a second generator
    other = _load(checkpoint)
    prompts = [_prompt(seed, 200 + 50 * seed) for seed in (1, 2, 3)]
    params = [SamplingParams(max_new_tokens=16), SamplingParams(max_new_tokens=8, deterministic=True),
              SamplingParams(max_new_tokens=16, temperature=0.8, seed=5)]
    batched = other.generate([prompts[0], prompt, *prompts[1:]], [params[0], DET, *params[1:]])[1]
    assert _bits(batched) == _bits(alone)
    changed = other.generate([[7] + prompt[1:]], DET)[0]
    assert _bits(changed) != _bits(alone)  # negative control: the comparison sees the prompt
