"""The functional model and the loader agree with transformers' own implementation.

For each supported family a small random transformers model is saved as a
safetensors checkpoint, loaded back with llm42's loader, and its logits are
compared with transformers' forward: a full-prompt prefill, token-by-token
decode through the paged K/V cache (fast and canonical policies), and greedy
generation through ``DVRGenerator``.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers

from llm42 import DVRGenerator, KVStore, SamplingParams
from llm42.model import forward, load_config, load_weights
from llm42.model.config import rope_inv_freq
from llm42.policies import FastPolicy, FixedShapePolicy
from llm42.runner import ModelRunner, Segment

VOCAB = 199
MAX_POSITIONS = 64
BLOCK_SIZE = 4
MAX_REL_ERR = 1e-5
# transformers 5 writes `rope_parameters`; 4.x takes `rope_theta` + `rope_scaling`
IS_TRANSFORMERS_5 = int(transformers.__version__.split(".")[0]) >= 5

_COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=MAX_POSITIONS,
    rms_norm_eps=1e-5,
    bos_token_id=1,
    eos_token_id=2,
)
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
LINEAR_ROPE = {"rope_type": "linear", "rope_theta": 500.0, "factor": 4.0}

# name -> (config class, model class, config overrides)
FAMILIES = {
    "llama_gqa_untied": ("LlamaConfig", "LlamaForCausalLM", dict(tie_word_embeddings=False)),
    "llama_mha_tied": ("LlamaConfig", "LlamaForCausalLM", dict(num_key_value_heads=4, tie_word_embeddings=True)),
    "llama3_rope": ("LlamaConfig", "LlamaForCausalLM", dict(rope=LLAMA3_ROPE)),
    "linear_rope": ("LlamaConfig", "LlamaForCausalLM", dict(rope=LINEAR_ROPE)),
    "llama_attention_and_mlp_bias": ("LlamaConfig", "LlamaForCausalLM", dict(attention_bias=True, mlp_bias=True)),
    "mistral_sliding_window": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=5, head_dim=16)),
    "qwen2_qkv_bias": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
    "qwen3_qk_norm": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=24, num_key_value_heads=1)),
    "qwen3_attention_bias": ("Qwen3Config", "Qwen3ForCausalLM", dict(attention_bias=True, head_dim=24)),
}


def _rope_kwargs(rope: dict) -> dict:
    if IS_TRANSFORMERS_5:
        return {"rope_parameters": rope}
    scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    return {"rope_theta": rope["rope_theta"], "rope_scaling": scaling if scaling["rope_type"] != "default" else None}


def build_hf_model(name: str, *, seed: int = 0, **overrides) -> transformers.PreTrainedModel:
    """A seeded random fp32 transformers model whose norms and biases are not trivial and whose logits are peaked.

    The final norm is scaled up rather than the output head so tied models get
    peaked logits too without the token embedding swamping the residual stream
    (which makes greedy decoding repeat the last prompt token forever).
    """
    config_cls, model_cls, family_overrides = FAMILIES[name]
    if not hasattr(transformers, model_cls):
        pytest.skip(f"transformers {transformers.__version__} has no {model_cls}")
    fields = {**_COMMON, **family_overrides, **overrides}
    if "rope" in fields:
        fields.update(_rope_kwargs(fields.pop("rope")))
    config = getattr(transformers, config_cls)(**fields, initializer_range=0.2, attn_implementation="eager")
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if param_name.endswith("norm.weight"):
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            elif param_name.endswith(".bias"):
                param.copy_(0.2 * torch.randn_like(param))
        # larger logits: greedy argmaxes far from ties, like a trained model's
        model.model.norm.weight.mul_(3.0)
    # reference generation runs past eos, like ignore_eos=True (a generate() argument of None would
    # fall back to this default)
    model.generation_config.eos_token_id = None
    return model



@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """name -> (checkpoint directory, transformers model), each built once per module."""
    built: dict[str, tuple[Path, transformers.PreTrainedModel]] = {}

    def get(name: str) -> tuple[Path, transformers.PreTrainedModel]:
        if name not in built:
            model = build_hf_model(name)
            path = tmp_path_factory.mktemp(name)
            model.save_pretrained(path, safe_serialization=True)
            built[name] = (path, model)
        return built[name]

    return get


def copy_checkpoint(source: Path, target: Path) -> Path:
    shutil.copytree(source, target, dirs_exist_ok=True)
    return target


def rewrite_json(file: Path, edit) -> None:
    raw = json.loads(file.read_text())
    edit(raw)
    file.write_text(json.dumps(raw))


def token_sequence(length: int, seed: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (length,), generator=generator).tolist()


def hf_logits(model, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0]  # [L, V]


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    rel = ((actual - expected).abs().max() / expected.abs().max()).item()
    assert rel < MAX_REL_ERR, f"{what}: relative error {rel:.3g}"


def load(path: Path):
    cfg = load_config(path)
    return cfg, load_weights(path, cfg, dtype=torch.float32, device="cpu")


POLICIES = {"fast": FastPolicy, "canonical": lambda: FixedShapePolicy(key_block=8)}
GREEDY = SamplingParams(max_new_tokens=1)


def new_kv(cfg) -> KVStore:
    return KVStore(cfg, num_blocks=16, block_size=BLOCK_SIZE, num_scratch_slots=32)


def run_step(runner: ModelRunner, kv: KVStore, policy_name: str, segments: list[Segment],
             *, num_canonical_rows: int = 32) -> list[torch.Tensor]:
    """One forward over ``segments``; returns each segment's logits, one row per token ([len, V])."""
    for seg in segments:
        kv.append(seg.rid, seg.end)
    if policy_name == "fast":
        inputs = dataclasses.replace(runner.fast_inputs(segments, kv), logits_rows=None)
    else:
        inputs = runner.canonical_inputs(segments, kv, num_canonical_rows)
    logits = forward(runner.weights, runner.cfg, inputs, kv.layers(), POLICIES[policy_name]())
    out, row = [], 0
    for seg in segments:
        out.append(logits[row: row + len(seg.tokens)])
        row += len(seg.tokens)
    return out


def prefill_logits(cfg, weights, tokens: list[int], policy_name: str = "fast") -> torch.Tensor:
    """llm42's logits [L, V] for every position of ``tokens``, in one forward from an empty cache."""
    kv = new_kv(cfg)
    kv.allocate(0, len(tokens))
    (logits,) = run_step(ModelRunner(weights, cfg), kv, policy_name, [Segment(0, tuple(tokens), 0, GREEDY, 0)])
    return logits


# -- logits ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("policy_name", POLICIES)
@pytest.mark.parametrize("family", FAMILIES)
def test_prefill_logits_match_transformers(checkpoints, family, policy_name):
    path, model = checkpoints(family)
    tokens = token_sequence(21, seed=1)
    logits = prefill_logits(*load(path), tokens, policy_name)
    assert_close(logits, hf_logits(model, tokens), f"{family} prefill ({policy_name})")


@pytest.mark.parametrize("policy_name", POLICIES)
@pytest.mark.parametrize("family", FAMILIES)
def test_paged_decode_logits_match_transformers(checkpoints, family, policy_name):
    """Two sequences decoded in lockstep, one token per step, their K/V blocks interleaved in the store."""
    path, model = checkpoints(family)
    cfg, weights = load(path)
    runner = ModelRunner(weights, cfg)
    kv = new_kv(cfg)
    sequences = {0: token_sequence(22, seed=2), 1: token_sequence(15, seed=3)}
    # in the first step seq 1's padding query rows see no key at all under Mistral's window; they
    # must not disturb the real rows
    prefill_lens = {0: 12, 1: 2}
    expected = {rid: hf_logits(model, toks) for rid, toks in sequences.items()}
    for rid, toks in sequences.items():
        kv.allocate(rid, len(toks))

    segments = [Segment(rid, tuple(sequences[rid][:n]), 0, GREEDY, 0) for rid, n in prefill_lens.items()]
    num_checked = 0
    while segments:
        for seg, logits in zip(segments, run_step(runner, kv, policy_name, segments)):
            assert_close(logits, expected[seg.rid][seg.start: seg.end],
                         f"{family} rid {seg.rid} positions [{seg.start}, {seg.end}) ({policy_name})")
            num_checked += len(seg.tokens)
        segments = [
            Segment(seg.rid, (sequences[seg.rid][seg.end],), seg.end, GREEDY, 0)
            for seg in segments if seg.end < len(sequences[seg.rid])
        ]
    assert num_checked == sum(len(t) for t in sequences.values())
    # the two requests' blocks really are interleaved, so the block tables matter
    assert kv.block_table(0) != list(range(len(kv.block_table(0))))


# -- generation -----------------------------------------------------------------------------------

@pytest.mark.parametrize("deterministic", [False, True], ids=["fast", "deterministic"])
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_generation_matches_transformers_generate(checkpoints, family, deterministic):
    path, model = checkpoints(family)
    prompts = [token_sequence(5, seed=4), token_sequence(9, seed=5)]
    num_new = 14
    expected, expected_logprobs = [], []
    for prompt in prompts:
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=num_new, pad_token_id=0,
                                 output_scores=True, return_dict_in_generate=True)
        tokens = out.sequences[0, len(prompt):].tolist()
        expected.append(tokens)
        expected_logprobs.append([torch.log_softmax(s[0], -1)[t].item() for s, t in zip(out.scores, tokens)])
    assert all(len(e) == num_new for e in expected)
    assert all(len(set(e)) >= 4 for e in expected), f"degenerate reference: greedy output repeats {expected}"

    gen = DVRGenerator.from_pretrained(path, window=4, group=2)
    params = SamplingParams(max_new_tokens=num_new, deterministic=deterministic, ignore_eos=True, logprobs=True)
    completions = gen.generate(prompts, params)
    for completion, want, want_logprobs in zip(completions, expected, expected_logprobs):
        assert completion.token_ids == want
        assert completion.finish_reason == "length"
        assert completion.logprobs == pytest.approx(want_logprobs, abs=1e-4)
    assert (gen.stats["canonical_passes"] > 0) == deterministic


@pytest.mark.parametrize("deterministic", [False, True], ids=["fast", "deterministic"])
def test_generation_config_eos_ids_stop_generation_like_transformers(checkpoints, tmp_path, deterministic):
    """Chat checkpoints list end-of-turn ids in generation_config.json only; both libraries stop on them."""
    source, model = checkpoints("llama_gqa_untied")
    path = copy_checkpoint(source, tmp_path / "ckpt")
    prompt = token_sequence(5, seed=4)
    with torch.no_grad():
        free_run = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=14, pad_token_id=0)
    free_tokens = free_run[0, len(prompt):].tolist()
    stop_token = free_tokens[5]
    rewrite_json(path / "generation_config.json", lambda raw: raw.update(eos_token_id=[VOCAB - 1, stop_token]))
    assert json.loads((path / "config.json").read_text())["eos_token_id"] == 2

    reloaded = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager")
    with torch.no_grad():
        out = reloaded.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=14, pad_token_id=0)
    expected = out[0, len(prompt):].tolist()
    assert expected[-1] == stop_token and len(expected) == free_tokens.index(stop_token) + 1

    assert load_config(path).eos_token_ids == (VOCAB - 1, stop_token)
    gen = DVRGenerator.from_pretrained(path, window=4, group=2)
    (completion,) = gen.generate([prompt], SamplingParams(max_new_tokens=14, deterministic=deterministic))
    assert completion.token_ids == expected
    assert completion.finish_reason == "stop"


# -- the tests above are not vacuous --------------------------------------------------------------

def test_llama3_and_linear_rope_scaling_change_frequencies(checkpoints):
    for family in ("llama3_rope", "linear_rope"):
        cfg = load_config(checkpoints(family)[0])
        plain = dataclasses.replace(cfg, rope=dataclasses.replace(cfg.rope, rope_type="default", factor=1.0))
        assert not torch.allclose(rope_inv_freq(cfg), rope_inv_freq(plain)), family
    # llama3 leaves high frequencies alone, divides low ones by the factor and smooths in between
    cfg = load_config(checkpoints("llama3_rope")[0])
    plain = dataclasses.replace(cfg, rope=dataclasses.replace(cfg.rope, rope_type="default"))
    ratio = rope_inv_freq(plain) / rope_inv_freq(cfg)
    assert ratio[0] == 1.0 and ratio[-1] == pytest.approx(8.0)
    assert ((ratio > 1.0) & (ratio < 8.0)).any()


def test_mistral_sliding_window_is_shorter_than_the_sequence_and_changes_logits(checkpoints):
    path, model = checkpoints("mistral_sliding_window")
    cfg, weights = load(path)
    assert cfg.sliding_window == 5
    tokens = token_sequence(21, seed=1)
    logits = prefill_logits(dataclasses.replace(cfg, sliding_window=None), weights, tokens)
    expected = hf_logits(model, tokens)
    # the first `window` positions see every key either way; later ones do not
    assert_close(logits[:5], expected[:5], "positions inside the window")
    assert (logits[5:] - expected[5:]).abs().max() > 1e-2


def test_qwen3_explicit_head_dim_is_used(checkpoints):
    cfg = load_config(checkpoints("qwen3_qk_norm")[0])
    assert cfg.head_dim == 24 != cfg.hidden_size // cfg.num_heads
    assert cfg.qk_norm and not cfg.attention_bias


def test_qwen2_has_qkv_bias_only_and_tied_embeddings(checkpoints):
    cfg, weights = load(checkpoints("qwen2_qkv_bias")[0])
    assert cfg.attention_bias and cfg.tie_word_embeddings
    assert not cfg.o_proj_bias and not cfg.mlp_bias
    assert weights.layers[0].qkv_bias is not None
    assert weights.lm_head is weights.embed


def test_llama_attention_bias_covers_o_proj_and_mlp_bias_is_loaded(checkpoints):
    cfg, weights = load(checkpoints("llama_attention_and_mlp_bias")[0])
    assert cfg.attention_bias and cfg.o_proj_bias and cfg.mlp_bias
    layer = weights.layers[0]
    assert all(b is not None for b in (layer.qkv_bias, layer.o_proj_bias, layer.gate_up_bias, layer.down_bias))


# -- config spellings and checkpoint layouts -------------------------------------------------------

def _to_legacy_rope(raw: dict, legacy_fields: dict) -> None:
    for key in ("rope_parameters", "rope_scaling", "rope_theta"):
        raw.pop(key, None)
    raw.update(legacy_fields)


@pytest.mark.parametrize(
    "family, legacy_fields",
    [
        ("linear_rope", {"rope_theta": 500.0, "rope_scaling": {"type": "linear", "factor": 4.0}}),
        ("llama3_rope", {"rope_theta": 10000.0,
                         "rope_scaling": {k: v for k, v in LLAMA3_ROPE.items() if k != "rope_theta"}}),
    ],
    ids=["rope_theta_and_linear_rope_scaling", "rope_theta_and_llama3_rope_scaling"],
)
def test_legacy_rope_theta_config_spelling_matches_transformers(checkpoints, tmp_path, family, legacy_fields):
    source, model = checkpoints(family)
    path = copy_checkpoint(source, tmp_path / "ckpt")
    rewrite_json(path / "config.json", lambda raw: _to_legacy_rope(raw, legacy_fields))
    assert "rope_parameters" not in json.loads((path / "config.json").read_text())
    assert load_config(path).rope == load_config(source).rope
    tokens = token_sequence(21, seed=6)
    assert_close(prefill_logits(*load(path), tokens), hf_logits(model, tokens), f"{family}, legacy rope spelling")


def test_rope_theta_only_config_uses_that_theta(tmp_path):
    model = build_hf_model("llama_gqa_untied", rope={"rope_type": "default", "rope_theta": 300.0})
    model.save_pretrained(tmp_path, safe_serialization=True)
    rewrite_json(tmp_path / "config.json", lambda raw: _to_legacy_rope(raw, {"rope_theta": 300.0}))
    cfg, weights = load(tmp_path)
    assert cfg.rope.theta == 300.0 and cfg.rope.rope_type == "default"
    tokens = token_sequence(21, seed=7)
    assert_close(prefill_logits(cfg, weights, tokens, "canonical"), hf_logits(model, tokens), "rope_theta only")


@pytest.mark.skipif(not IS_TRANSFORMERS_5, reason="transformers 4 requires original_max_position_embeddings")
def test_llama3_rope_without_original_max_positions_falls_back_to_context_length(tmp_path):
    model = build_hf_model("llama3_rope", rope={**LLAMA3_ROPE, "original_max_position_embeddings": MAX_POSITIONS})
    model.save_pretrained(tmp_path, safe_serialization=True)
    rewrite_json(tmp_path / "config.json",
                 lambda raw: raw["rope_parameters"].pop("original_max_position_embeddings"))
    tokens = token_sequence(21, seed=9)
    expected = hf_logits(model, tokens)
    # transformers reads the stripped config the way the original model was built
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager")
    assert_close(hf_logits(reloaded, tokens), expected, "transformers on the stripped config")
    cfg, weights = load(tmp_path)
    assert cfg.rope.original_max_position_embeddings == MAX_POSITIONS
    assert_close(prefill_logits(cfg, weights, tokens), expected, "llama3 rope without original_max_position_embeddings")


def test_sharded_checkpoint_loads_and_matches_transformers(tmp_path):
    model = build_hf_model("qwen3_qk_norm", seed=3)
    model.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="40KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) > 1 and all((tmp_path / s).is_file() for s in shards)
    tokens = token_sequence(21, seed=8)
    assert_close(prefill_logits(*load(tmp_path), tokens), hf_logits(model, tokens), "sharded checkpoint")
