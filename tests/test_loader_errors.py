"""Every bad checkpoint is refused with an error that names the problem, before any tensor is used."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import llm42
from llm42 import CheckpointError, DVRGenerator, UnsupportedModelError
from llm42.model import load_config, load_weights
from llm42.model.weights import hf_tensor_shapes

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 32,
    "hidden_size": 16,
    "intermediate_size": 24,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 32,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "tie_word_embeddings": False,
    "eos_token_id": 2,
}


def write_checkpoint(directory: Path, config: dict | None = None, *, tensors: dict | None = None) -> Path:
    """A complete, valid checkpoint for ``config``; ``tensors`` replaces the random ones wholesale."""
    config = CONFIG if config is None else config
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    if tensors is None:
        generator = torch.Generator().manual_seed(0)
        cfg = load_config(directory)
        tensors = {name: torch.randn(shape, generator=generator) for name, shape in hf_tensor_shapes(cfg).items()}
    save_file(tensors, str(directory / "model.safetensors"))
    return directory


def valid_tensors(directory: Path) -> dict[str, torch.Tensor]:
    return load_file(str(directory / "model.safetensors"))


def load(directory: Path):
    cfg = load_config(directory)
    return load_weights(directory, cfg, dtype=torch.float32, device="cpu")


def test_errors_are_value_errors_exported_at_top_level():
    assert issubclass(llm42.CheckpointError, ValueError)
    assert issubclass(llm42.UnsupportedModelError, ValueError)


def test_valid_checkpoint_loads(tmp_path):
    weights = load(write_checkpoint(tmp_path / "ok"))
    assert weights.embed.shape == (32, 16)


# -- the directory and config.json ----------------------------------------------------------------

def test_missing_directory_is_named(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(CheckpointError, match=r"no-such-model.*does not exist"):
        load_config(missing)
    with pytest.raises(CheckpointError, match="does not exist"):
        DVRGenerator.from_pretrained(missing)


def test_path_that_is_a_file_is_refused(tmp_path):
    file = tmp_path / "model.safetensors"
    file.write_bytes(b"")
    with pytest.raises(CheckpointError, match="is not a directory"):
        load_config(file)


def test_directory_without_config_json_is_refused(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError, match="has no config.json"):
        load_config(tmp_path)
    with pytest.raises(CheckpointError, match="has no config.json"):
        DVRGenerator.from_pretrained(tmp_path)


def test_invalid_json_config_is_refused(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["LlamaForCausalLM"],')
    with pytest.raises(CheckpointError, match=r"config.json: not valid JSON"):
        load_config(tmp_path)


def test_config_json_that_is_not_an_object_is_refused(tmp_path):
    (tmp_path / "config.json").write_text("[1, 2, 3]")
    with pytest.raises(CheckpointError, match="expected a JSON object, got list"):
        load_config(tmp_path)


def test_unsupported_architecture_is_named(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({**CONFIG, "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"})
    )
    with pytest.raises(UnsupportedModelError, match=r"unsupported architecture \['GPT2LMHeadModel'\]"):
        load_config(tmp_path)
    with pytest.raises(UnsupportedModelError, match="GPT2LMHeadModel"):
        DVRGenerator.from_pretrained(tmp_path)


@pytest.mark.parametrize(
    "rope_fields, rope_type",
    [
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}}, "yarn"),
        ({"rope_parameters": None, "rope_theta": 10000.0, "rope_scaling": {"type": "dynamic", "factor": 2.0}},
         "dynamic"),
    ],
    ids=["rope_parameters_yarn", "legacy_rope_scaling_dynamic"],
)
def test_unsupported_rope_type_is_named(tmp_path, rope_fields, rope_type):
    (tmp_path / "config.json").write_text(json.dumps({**CONFIG, **rope_fields}))
    with pytest.raises(UnsupportedModelError, match=f"unsupported rope_type '{rope_type}'"):
        load_config(tmp_path)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"hidden_act": "gelu"}, "unsupported hidden_act 'gelu'"),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
         "partial_rotary_factor=0.5"),
        ({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "use_sliding_window": True},
         "use_sliding_window=true"),
    ],
    ids=["gelu_activation", "partial_rotary", "qwen2_sliding_window"],
)
def test_unsupported_option_is_named(tmp_path, fields, message):
    (tmp_path / "config.json").write_text(json.dumps({**CONFIG, **fields}))
    with pytest.raises(UnsupportedModelError, match=re.escape(message)):
        load_config(tmp_path)


def test_missing_required_config_field_is_named(tmp_path):
    config = {k: v for k, v in CONFIG.items() if k != "hidden_size"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="missing required field 'hidden_size'"):
        load_config(tmp_path)


def test_inconsistent_head_counts_are_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**CONFIG, "num_key_value_heads": 3}))
    with pytest.raises(ValueError, match=r"num_attention_heads \(2\) must be a multiple of num_key_value_heads \(3\)"):
        load_config(tmp_path)


# -- the tensors ----------------------------------------------------------------------------------

def test_directory_without_safetensors_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    (tmp_path / "pytorch_model.bin").write_bytes(b"pickled weights are never loaded")
    with pytest.raises(CheckpointError, match=r"has no \*\.safetensors file"):
        load(tmp_path)
    with pytest.raises(CheckpointError, match=r"has no \*\.safetensors file"):
        DVRGenerator.from_pretrained(tmp_path)


def test_missing_tensor_is_named(tmp_path):
    source = write_checkpoint(tmp_path / "ok")
    tensors = valid_tensors(source)
    del tensors["model.layers.0.self_attn.k_proj.weight"]
    broken = write_checkpoint(tmp_path / "broken", tensors=tensors)
    with pytest.raises(CheckpointError, match=r"lacks tensor\(s\) 'model\.layers\.0\.self_attn\.k_proj\.weight'"):
        load(broken)


def test_missing_lm_head_of_untied_model_is_named(tmp_path):
    source = write_checkpoint(tmp_path / "ok")
    tensors = valid_tensors(source)
    del tensors["lm_head.weight"]
    with pytest.raises(CheckpointError, match="'lm_head.weight'"):
        load(write_checkpoint(tmp_path / "broken", tensors=tensors))


def test_misshaped_tensor_is_named_with_both_shapes(tmp_path):
    source = write_checkpoint(tmp_path / "ok")
    tensors = valid_tensors(source)
    tensors["model.layers.0.mlp.up_proj.weight"] = torch.zeros(25, 16)
    broken = write_checkpoint(tmp_path / "broken", tensors=tensors)
    with pytest.raises(
        CheckpointError,
        match=r"'model\.layers\.0\.mlp\.up_proj\.weight' has shape \(25, 16\), config\.json implies \(24, 16\)",
    ):
        load(broken)


def test_checkpoint_for_a_different_config_is_refused(tmp_path):
    # a checkpoint of a wider model under this config.json: the first mismatch is named
    write_checkpoint(tmp_path, {**CONFIG, "hidden_size": 32})
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    with pytest.raises(CheckpointError, match=r"has shape \([\d, ]*32[\d, ]*\), config\.json implies \(.*16.*\)"):
        load(tmp_path)


def test_unexpected_tensor_is_named(tmp_path):
    # an o_proj bias the config does not declare would otherwise be silently dropped
    source = write_checkpoint(tmp_path / "ok")
    tensors = valid_tensors(source)
    tensors["model.layers.0.self_attn.o_proj.bias"] = torch.zeros(16)
    with pytest.raises(CheckpointError, match=r"unexpected tensor 'model\.layers\.0\.self_attn\.o_proj\.bias'"):
        load(write_checkpoint(tmp_path / "broken", tensors=tensors))


def test_tied_checkpoint_may_still_carry_lm_head_and_rotary_cache(tmp_path):
    tied = {**CONFIG, "tie_word_embeddings": True}
    source = write_checkpoint(tmp_path / "ok", tied)
    tensors = valid_tensors(source)
    assert "lm_head.weight" not in tensors
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(4)
    weights = load(write_checkpoint(tmp_path / "extra", tied, tensors=tensors))
    assert weights.lm_head is weights.embed


def test_unreadable_safetensors_file_is_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    (tmp_path / "model.safetensors").write_bytes(b"this is not a safetensors file")
    with pytest.raises(CheckpointError, match=r"model\.safetensors: not a readable safetensors file"):
        load(tmp_path)


# -- sharded checkpoints --------------------------------------------------------------------------

def write_sharded(directory: Path) -> dict[str, str]:
    """Split a valid checkpoint into two shards plus an index; returns the weight map."""
    tensors = valid_tensors(write_checkpoint(directory))
    (directory / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    weight_map = {}
    for shard, shard_names in shards.items():
        save_file({n: tensors[n] for n in shard_names}, str(directory / shard))
        weight_map.update({n: shard for n in shard_names})
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return weight_map


def test_sharded_checkpoint_loads(tmp_path):
    write_sharded(tmp_path)
    assert load(tmp_path).embed.shape == (32, 16)


def test_index_naming_a_missing_shard_is_refused(tmp_path):
    write_sharded(tmp_path)
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(
        CheckpointError, match=r"model\.safetensors\.index\.json: names shard\(s\) that are not present: "
                               r"\['model-00002-of-00002\.safetensors'\]",
    ):
        load(tmp_path)


def test_invalid_index_json_is_refused(tmp_path):
    write_sharded(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text('{"metadata": {}}')
    with pytest.raises(CheckpointError, match=r"index\.json: not a valid safetensors index with a 'weight_map'"):
        load(tmp_path)


def test_invalid_generation_config_json_is_refused(tmp_path):
    write_checkpoint(tmp_path)
    (tmp_path / "generation_config.json").write_text("{")
    with pytest.raises(CheckpointError, match=r"generation_config\.json: not valid JSON"):
        load_config(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": ["</s>"]}))
    with pytest.raises(CheckpointError, match=r"generation_config\.json: eos_token_id must be"):
        load_config(tmp_path)


# -- the tokenizer --------------------------------------------------------------------------------

def test_generic_tokenizer_loads_as_auto_tokenizer_would(tmp_path):
    # a tokenizer.json of the generic class skips AutoTokenizer's config lookup, with the same result
    from transformers import AutoTokenizer

    from llm42.model import embedded_model_path, load_tokenizer

    tokenizer = load_tokenizer(embedded_model_path())
    auto = AutoTokenizer.from_pretrained(str(embedded_model_path()))
    assert type(tokenizer) is type(auto)
    text = "Once upon a time, Lily met a big dog."
    ids = tokenizer(text)["input_ids"]
    assert ids == auto(text)["input_ids"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == auto.decode(ids, skip_special_tokens=True)
    assert load_tokenizer(tmp_path) is None  # no tokenizer files


# -- corrupt contents ---------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weight_is_named(tmp_path, bad):
    directory = write_checkpoint(tmp_path / "ok")
    tensors = valid_tensors(directory)
    name = "model.layers.0.mlp.down_proj.weight"
    tensors[name][3, 5] = bad
    write_checkpoint(tmp_path / "bad", tensors=tensors)
    with pytest.raises(CheckpointError, match=re.escape(repr(name)) + ".*NaN or infinite"):
        load(tmp_path / "bad")


def test_corrupt_tensor_bytes_are_detected_and_named(tmp_path):
    directory = write_checkpoint(tmp_path)
    load(directory)  # negative control: the intact file loads
    file = directory / "model.safetensors"
    raw = bytearray(file.read_bytes())
    header_len = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8: 8 + header_len])
    name = "model.norm.weight"
    start, _ = header[name]["data_offsets"]
    data = 8 + header_len + start
    raw[data: data + 8] = b"\xff" * 8  # two float32 NaNs in the middle of the file
    file.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=re.escape(repr(name))):
        load(directory)


def test_non_utf8_config_json_is_named(tmp_path):
    directory = write_checkpoint(tmp_path)
    (directory / "config.json").write_bytes(json.dumps(CONFIG).encode("utf-16"))
    with pytest.raises(CheckpointError, match=r"config\.json.*UTF-8"):
        load_config(directory)


def test_non_utf8_generation_config_is_named(tmp_path):
    directory = write_checkpoint(tmp_path)
    (directory / "generation_config.json").write_bytes(b'{"eos_token_id": "\xff\xfe"}')
    with pytest.raises(CheckpointError, match=r"generation_config\.json.*UTF-8"):
        load_config(directory)


@pytest.mark.parametrize("content", [b"{ not json", b"\xff\xfe\x00garbage", b'{"version": "1.0"}'])
def test_broken_tokenizer_json_is_named(tmp_path, content):
    from llm42.model import embedded_model_path, load_tokenizer

    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((embedded_model_path() / name).read_bytes())
    assert load_tokenizer(tmp_path) is not None  # negative control: the copied files load
    (tmp_path / "tokenizer.json").write_bytes(content)
    with pytest.raises(CheckpointError, match=r"tokenizer\.json"):
        load_tokenizer(tmp_path)
