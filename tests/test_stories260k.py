"""The embedded stories260K checkpoint (a real trained tiny Llama) generates what transformers generates."""

from __future__ import annotations

import math

import pytest
import torch
import transformers

from llm42 import DVRGenerator, SamplingParams
from llm42.model import embedded_model_path

PROMPT = "Once upon a time"
NUM_NEW = 40
# the model card's check (src/llm42/data/stories260K/README.md)
STORY_START = ", there was a little girl named Lily. She loved to play outside in the park."



@pytest.fixture(scope="module")
def reference():
    """transformers' greedy continuation: (prompt ids, output ids, per-token log-probs, text)."""
    path = embedded_model_path()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.LlamaForCausalLM.from_pretrained(path).eval()  # float32, as stored
    prompt_ids = tokenizer(PROMPT)["input_ids"]
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt_ids]), do_sample=False, max_new_tokens=NUM_NEW,
            output_scores=True, return_dict_in_generate=True,
        )
    token_ids = out.sequences[0, len(prompt_ids):].tolist()
    logprobs = [torch.log_softmax(score[0].float(), -1)[t].item() for score, t in zip(out.scores, token_ids)]
    text = tokenizer.decode(token_ids, skip_special_tokens=True)
    return prompt_ids, token_ids, logprobs, text


def test_transformers_reference_is_the_lily_story(reference):
    _, token_ids, _, text = reference
    assert len(token_ids) == NUM_NEW
    assert text.startswith(STORY_START)


@pytest.mark.parametrize("deterministic", [False, True], ids=["fast", "deterministic"])
@pytest.mark.parametrize("path", [None, embedded_model_path()], ids=["default_path", "explicit_path"])
def test_greedy_story_matches_transformers(reference, path, deterministic):
    prompt_ids, want_ids, want_logprobs, want_text = reference
    gen = DVRGenerator.from_pretrained(path)
    params = SamplingParams(max_new_tokens=NUM_NEW, deterministic=deterministic, logprobs=True)
    (completion,) = gen.generate([PROMPT], params)

    assert completion.prompt_token_ids == prompt_ids
    assert completion.token_ids == want_ids
    assert completion.finish_reason == "length"
    assert completion.text == want_text
    assert completion.text.startswith(STORY_START)
    assert len(completion.logprobs) == NUM_NEW
    assert all(math.isfinite(lp) and lp <= 0.0 for lp in completion.logprobs)
    assert completion.logprobs == pytest.approx(want_logprobs, abs=1e-4)
    if deterministic:
        assert gen.stats["canonical_passes"] > 0


def test_token_id_prompt_gives_the_same_story_as_the_string(reference):
    prompt_ids, want_ids, _, want_text = reference
    gen = DVRGenerator.from_pretrained()
    params = SamplingParams(max_new_tokens=NUM_NEW, deterministic=True)
    from_ids, from_text = gen.generate([prompt_ids, PROMPT], params)
    assert from_ids.token_ids == from_text.token_ids == want_ids
    assert from_ids.text == want_text
    assert from_ids.logprobs is None
