"""GGUF checkpoints: a GGUF file loads to exactly the weights of the directory it was made from,
``convert`` writes a directory that loads to the same weights, and every bad file is refused with an
error naming it.

The files are stories260K written as GGUF by ``tests/gguf_files.py`` (llama.cpp's names, q/k
permutation and metadata), so they are small and fast; the real SmolLM2 file is
``tests/test_smollm2.py``'s.
"""

from __future__ import annotations

import shutil

import pytest
import torch

pytest.importorskip("gguf", reason="GGUF support needs the 'gguf' package (pip install 'llm42[gguf]')")
pytest.importorskip("accelerate", reason="GGUF support needs the 'accelerate' package (pip install 'llm42[gguf]')")

from llm42 import CheckpointError, DVRGenerator, SamplingParams, UnsupportedModelError  # noqa: E402
from llm42.cli import main  # noqa: E402
from llm42.model import convert_gguf, embedded_model_path, find_gguf_file, load_checkpoint  # noqa: E402
from llm42.model import gguf as gguf_module  # noqa: E402
from tests.gguf_files import CHAT_TEMPLATE, write_stories_gguf  # noqa: E402


@pytest.fixture(scope="module")
def stories_gguf(tmp_path_factory):
    """stories260K as a float32 GGUF file with a chat template, written once."""
    return write_stories_gguf(tmp_path_factory.mktemp("gguf") / "stories260K.gguf", chat_template=CHAT_TEMPLATE)


@pytest.fixture(scope="module")
def stories_from_gguf(stories_gguf):
    return load_checkpoint(stories_gguf, dtype=torch.float32, device="cpu")


def weight_tensors(weights) -> list[torch.Tensor]:
    out = [weights.embed, weights.norm, weights.lm_head, weights.rope_cos, weights.rope_sin]
    for layer in weights.layers:
        out += [t for t in vars(layer).values() if t is not None]
    return out


def assert_same_weights(a, b) -> None:
    for x, y in zip(weight_tensors(a), weight_tensors(b), strict=True):
        assert x.dtype == y.dtype and torch.equal(x, y)


# -- loading ----------------------------------------------------------------------------------------

def test_gguf_file_loads_to_the_weights_of_its_source_directory(stories_from_gguf):
    directory = load_checkpoint(embedded_model_path(), dtype=torch.float32, device="cpu")
    assert stories_from_gguf.cfg == directory.cfg
    assert_same_weights(stories_from_gguf.weights, directory.weights)


def test_gguf_tokenizer_and_chat_template_come_with_the_file(stories_from_gguf):
    reference = load_checkpoint(embedded_model_path(), dtype=torch.float32, device="cpu").tokenizer
    tokenizer = stories_from_gguf.tokenizer
    text = "Once upon a time, Lily saw a big dog."
    assert tokenizer(text)["input_ids"] == reference(text)["input_ids"]
    assert tokenizer.chat_template == CHAT_TEMPLATE
    assert stories_from_gguf.cfg.eos_token_ids == (2,)


def test_directory_holding_one_gguf_file_loads_it(stories_gguf, tmp_path):
    shutil.copy(stories_gguf, tmp_path / "model.gguf")
    assert find_gguf_file(tmp_path) == tmp_path / "model.gguf"
    gen = DVRGenerator.from_pretrained(tmp_path)
    reference = DVRGenerator.from_pretrained()
    params = SamplingParams(max_new_tokens=12, deterministic=True, logprobs=True)
    assert gen.generate(["Once upon a time"], params)[0] == reference.generate(["Once upon a time"], params)[0]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gguf_is_dequantized_to_the_requested_dtype(stories_gguf, stories_from_gguf, dtype):
    loaded = load_checkpoint(stories_gguf, dtype=dtype, device="cpu", with_tokenizer=False)
    assert loaded.weights.dtype == dtype
    assert torch.equal(loaded.weights.layers[1].qkv, stories_from_gguf.weights.layers[1].qkv.to(dtype))


def test_quantized_gguf_loads_close_to_the_float_weights(tmp_path, stories_from_gguf):
    quantized = load_checkpoint(write_stories_gguf(tmp_path / "q8.gguf", tensor_type="Q8_0"),
                                dtype=torch.float32, device="cpu", with_tokenizer=False)
    exact, q8 = stories_from_gguf.weights.embed, quantized.weights.embed
    assert not torch.equal(q8, exact)
    assert (q8 - exact).abs().max() <= exact.abs().max() / 100  # 8-bit blocks


def test_gguf_without_tokenizer_metadata_loads_without_a_tokenizer(tmp_path):
    loaded = load_checkpoint(write_stories_gguf(tmp_path / "bare.gguf", with_tokenizer=False),
                             dtype=torch.float32, device="cpu")
    assert loaded.tokenizer is None


# -- convert ----------------------------------------------------------------------------------------

def test_converted_directory_loads_to_the_same_weights(stories_gguf, stories_from_gguf, tmp_path):
    dst = convert_gguf(stories_gguf, tmp_path / "out")
    assert {p.name for p in dst.iterdir()} >= {"config.json", "model.safetensors", "generation_config.json",
                                               "tokenizer.json", "tokenizer_config.json"}
    converted = load_checkpoint(dst, dtype=torch.float32, device="cpu")
    assert converted.cfg == stories_from_gguf.cfg
    assert_same_weights(converted.weights, stories_from_gguf.weights)
    assert converted.tokenizer.chat_template == CHAT_TEMPLATE
    assert "quantization_config" not in (dst / "config.json").read_text()


def test_tied_gguf_converts_and_loads_back_tied(tmp_path):
    tied = write_stories_gguf(tmp_path / "tied.gguf", tie_embeddings=True)
    from_gguf = load_checkpoint(tied, dtype=torch.float32, device="cpu", with_tokenizer=False)
    assert from_gguf.cfg.tie_word_embeddings and from_gguf.weights.lm_head is from_gguf.weights.embed
    converted = load_checkpoint(convert_gguf(tied, tmp_path / "out"), dtype=torch.float32, device="cpu")
    assert converted.cfg == from_gguf.cfg
    assert_same_weights(converted.weights, from_gguf.weights)


def test_cli_convert_writes_the_requested_dtype(stories_gguf, stories_from_gguf, tmp_path, capsys):
    assert main(["convert", str(stories_gguf), str(tmp_path / "bf16"), "--dtype", "bfloat16"]) == 0
    assert "wrote" in capsys.readouterr().out
    converted = load_checkpoint(tmp_path / "bf16", dtype=torch.bfloat16, device="cpu")
    from_gguf = load_checkpoint(stories_gguf, dtype=torch.bfloat16, device="cpu", with_tokenizer=False)
    assert_same_weights(converted.weights, from_gguf.weights)


def test_cli_convert_refuses_a_non_empty_destination_and_a_missing_source(stories_gguf, tmp_path, capsys):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("x")
    assert main(["convert", str(stories_gguf), str(tmp_path / "full")]) == 2
    assert "exists and is not an empty directory" in capsys.readouterr().err
    assert main(["convert", str(tmp_path / "missing.gguf"), str(tmp_path / "out")]) == 2
    assert "missing.gguf" in capsys.readouterr().err


# -- bad files: each error names the file ------------------------------------------------------------

def test_directory_with_several_gguf_files_is_refused(stories_gguf, tmp_path):
    for name in ("a.gguf", "b.gguf"):
        shutil.copy(stories_gguf, tmp_path / name)
    with pytest.raises(CheckpointError, match=r"holds 2 \.gguf files \(a\.gguf, b\.gguf\) and no config\.json"):
        DVRGenerator.from_pretrained(tmp_path)


def test_directory_with_neither_config_nor_gguf_is_refused(tmp_path):
    with pytest.raises(CheckpointError, match=r"has no config\.json \(and no \.gguf file\)"):
        DVRGenerator.from_pretrained(tmp_path)


def test_directory_with_config_json_is_read_as_hf_even_beside_a_gguf(stories_gguf, tmp_path):
    shutil.copytree(embedded_model_path(), tmp_path, dirs_exist_ok=True)
    shutil.copy(stories_gguf, tmp_path / "other.gguf")
    assert find_gguf_file(tmp_path) is None


def test_missing_gguf_file_is_named(tmp_path):
    with pytest.raises(CheckpointError, match=r"checkpoint file '.*nothing\.gguf' does not exist"):
        DVRGenerator.from_pretrained(tmp_path / "nothing.gguf")


def test_file_that_is_not_gguf_is_refused(tmp_path):
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"PK\x03\x04 not a gguf at all")
    with pytest.raises(CheckpointError, match=r"fake\.gguf: not a GGUF file"):
        DVRGenerator.from_pretrained(fake)


@pytest.mark.parametrize("keep", [0.5, 0.002], ids=["tensors", "header"])
def test_truncated_gguf_is_refused(stories_gguf, tmp_path, keep):
    data = stories_gguf.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(CheckpointError, match=r"cut\.gguf: not a readable GGUF file, corrupt or truncated"):
        DVRGenerator.from_pretrained(cut)


def test_architecture_transformers_cannot_read_is_named(tmp_path):
    with pytest.raises(UnsupportedModelError, match=r"rwkv6\.gguf: unsupported GGUF architecture 'rwkv6'"):
        DVRGenerator.from_pretrained(write_stories_gguf(tmp_path / "rwkv6.gguf", architecture="rwkv6"))


def test_architecture_llm42_does_not_implement_is_named(tmp_path):
    with pytest.raises(UnsupportedModelError, match=r"gpt2\.gguf: unsupported architecture 'gpt2'"):
        DVRGenerator.from_pretrained(write_stories_gguf(tmp_path / "gpt2.gguf", architecture="gpt2"))


def test_quantization_gguf_cannot_dequantize_is_named(tmp_path):
    with pytest.raises(UnsupportedModelError, match=r"q81\.gguf: unsupported quantization Q8_1"):
        DVRGenerator.from_pretrained(write_stories_gguf(tmp_path / "q81.gguf", tensor_type="Q8_1"))


def test_missing_gguf_package_names_the_extra(stories_gguf, monkeypatch):
    monkeypatch.setattr(gguf_module, "_missing_packages", lambda: ["gguf"])
    with pytest.raises(UnsupportedModelError, match=r"stories260K\.gguf: .*'gguf'.*pip install 'llm42\[gguf\]'"):
        DVRGenerator.from_pretrained(stories_gguf)


def test_cli_names_a_bad_gguf_in_one_line(tmp_path, capsys):
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"nope")
    assert main(["generate", "--model", str(fake), "hi"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("llm42 generate: error:") and "fake.gguf: not a GGUF file" in err
    assert len(err.splitlines()) == 1


def test_doctor_reads_a_gguf_file(stories_gguf):
    from llm42.doctor import load_model

    model = load_model(stories_gguf)
    reference = load_checkpoint(embedded_model_path(), dtype=torch.float32, device="cpu")
    assert model.cfg.num_layers == reference.cfg.num_layers
    assert torch.equal(model.weights.layers[0].qkv, reference.weights.layers[0].qkv)
