"""Chat prompts: a list of {"role", "content"} messages is rendered with the tokenizer's chat template,
in generate, submit and stream and on the command line; malformed messages are refused naming the field.

The model is the embedded stories260K with a small chat template added to its tokenizer.
"""

from __future__ import annotations

import json
import shutil

import pytest

from llm42 import DVRGenerator, SamplingParams
from llm42.cli import main
from llm42.model import embedded_model_path, load_tokenizer
from llm42.prompts import encode_prompt, is_chat
from tests.gguf_files import CHAT_TEMPLATE

MESSAGES = [{"role": "system", "content": "Tell a story."}, {"role": "user", "content": "Once upon a time"}]
PARAMS = SamplingParams(max_new_tokens=8, deterministic=True, logprobs=True)


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    """stories260K whose tokenizer_config.json carries a chat template."""
    directory = tmp_path_factory.mktemp("chat") / "stories260K-chat"
    shutil.copytree(embedded_model_path(), directory)
    config_file = directory / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**config, "chat_template": CHAT_TEMPLATE}))
    return directory


@pytest.fixture(scope="module")
def tokenizer(chat_dir):
    return load_tokenizer(chat_dir)


@pytest.fixture
def gen(chat_dir):
    return DVRGenerator.from_pretrained(chat_dir, window=4, group=2)


def test_messages_render_through_the_chat_template_with_the_assistant_turn(tokenizer):
    ids = encode_prompt(tokenizer, MESSAGES, 512)
    text = "<|system|>Tell a story.</s><|user|>Once upon a time</s><|assistant|>"
    assert tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False) == text
    assert ids == tokenizer(text, add_special_tokens=False)["input_ids"]
    assert is_chat(MESSAGES) and not is_chat([1, 2]) and not is_chat([]) and not is_chat("text")


def test_chat_prompt_generates_what_its_token_ids_generate(gen, tokenizer):
    ids = encode_prompt(tokenizer, MESSAGES, gen.vocab_size)
    by_messages, by_ids = gen.generate([MESSAGES, ids], PARAMS)
    assert by_messages.token_ids == by_ids.token_ids and by_messages.logprobs == by_ids.logprobs
    assert by_messages.prompt_token_ids == ids


def test_chat_prompts_go_through_submit_and_stream(gen, tokenizer):
    expected = gen.generate([MESSAGES], PARAMS)[0].token_ids
    rid = gen.submit(MESSAGES, PARAMS)
    while gen.has_unfinished():
        gen.step()
    assert gen.result(rid).token_ids == expected
    streamed = [tok for _, tokens in gen.stream([MESSAGES], PARAMS) for tok in tokens]
    assert streamed == expected


@pytest.mark.parametrize(
    "messages, error, message",
    [
        ([{"role": "user", "content": "hi"}, "hello"], TypeError, r"prompt message 1 must be a dict"),
        ([{"role": "user"}], ValueError, r"prompt message 0 has no 'content'"),
        ([{"content": "hi"}], ValueError, r"prompt message 0 has no 'role'"),
        ([{"role": "user", "content": 3}], TypeError, r"prompt message 0: 'content' must be a str, got int"),
        ([{"role": None, "content": "hi"}], TypeError, r"prompt message 0: 'role' must be a str"),
        ([{"role": "", "content": "hi"}], ValueError, r"prompt message 0: 'role' is empty"),
    ],
    ids=["not_a_dict", "no_content", "no_role", "content_not_str", "role_not_str", "empty_role"],
)
def test_malformed_messages_are_refused_naming_the_field(gen, messages, error, message):
    with pytest.raises(error, match=message):
        gen.generate([messages], PARAMS)
    assert not gen.has_unfinished()


def test_one_conversation_passed_as_the_prompt_list_gets_a_hint(gen):
    with pytest.raises(TypeError, match=r"got dict \(a chat conversation is one prompt: pass \[messages\]\)"):
        gen.generate(MESSAGES, PARAMS)


def test_chat_prompt_needs_a_chat_template():
    gen = DVRGenerator.from_pretrained(window=4, group=2)  # stories260K ships no chat template
    with pytest.raises(ValueError, match="tokenizer has no chat template"):
        gen.submit(MESSAGES, PARAMS)


def test_chat_prompt_needs_a_tokenizer(gen):
    bare = DVRGenerator(gen.weights, gen.cfg, tokenizer=None, window=4, group=2)
    with pytest.raises(ValueError, match="list of chat messages but this model has no tokenizer"):
        bare.submit(MESSAGES, PARAMS)


# -- the command line ------------------------------------------------------------------------------

def run(capsys, *argv):
    code = main([*argv, "--no-progress"])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_chat_sends_prompts_as_user_messages(chat_dir, gen, capsys):
    code, out, err = run(capsys, "generate", "--model", str(chat_dir), "--chat", "Once upon a time",
                         "--max-new-tokens", "8", "--deterministic", "--window", "4", "--group", "2")
    assert code == 0 and "note:" not in err
    record = json.loads(out)
    assert record["prompt"] == [{"role": "user", "content": "Once upon a time"}]
    expected = gen.generate([[{"role": "user", "content": "Once upon a time"}]],
                            SamplingParams(max_new_tokens=8, deterministic=True))[0]
    assert record["token_ids"] == expected.token_ids


def test_cli_notes_a_raw_prompt_to_a_model_with_a_chat_template(chat_dir, capsys):
    code, _, err = run(capsys, "generate", "--model", str(chat_dir), "Once upon a time", "--max-new-tokens", "2")
    assert code == 0
    notes = [line for line in err.splitlines() if "note:" in line]
    assert len(notes) == 1 and "--chat" in notes[0]


def test_cli_chat_needs_a_chat_template(capsys):
    code, _, err = run(capsys, "generate", "--chat", "Once upon a time", "--max-new-tokens", "2")
    assert code == 2 and "--chat: this model's tokenizer has no chat template" in err


def test_cli_chat_and_token_ids_exclude_each_other(capsys):
    code, _, err = run(capsys, "generate", "--chat", "--token-ids", "1 2 3")
    assert code == 2 and "--chat and --token-ids exclude each other" in err


def test_cli_check_runs_chat_prompts(chat_dir, capsys):
    code, out, err = run(capsys, "check", "--model", str(chat_dir), "--chat", "--num-batches", "1",
                         "--max-new-tokens", "6", "--window", "4", "--group", "2")
    assert code == 0, out + err
    assert "PASS: 3 prompt(s) x 1 batch(es)" in out and "note:" not in err
