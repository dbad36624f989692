"""Small GGUF files for tests, written with the ``gguf`` package the way llama.cpp's converter does.

:func:`write_stories_gguf` turns the embedded stories260K checkpoint (Llama,
5 layers, 8/4 heads, vocab 512) into a GGUF file: llama.cpp's tensor names,
its q/k row permutation, its metadata keys and a sentencepiece-style
tokenizer (tokens, merges, token types), optionally with a chat template.
Tensors stay float32 unless a GGML type is asked for, so the file must load
back to exactly the weights of the directory it came from.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

from llm42.model.loader import embedded_model_path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def _permute(w: np.ndarray, num_heads: int) -> np.ndarray:
    # llama.cpp's convert_hf_to_gguf.py `permute`: rotate-half rows -> interleaved pairs
    return w.reshape(num_heads, 2, w.shape[0] // num_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_stories_gguf(
    path: Path,
    *,
    architecture: str = "llama",
    tensor_type: str = "F32",
    chat_template: str | None = None,
    with_tokenizer: bool = True,
    tie_embeddings: bool = False,
) -> Path:
    """A GGUF file of stories260K at ``path``; ``tensor_type`` is a GGML type name (F32, F16, Q8_0, Q8_1).

    ``tie_embeddings`` leaves the output head out (the model then reads its token embedding there,
    as SmolLM2 does)."""
    import gguf

    source = embedded_model_path()
    config = json.loads((source / "config.json").read_text())
    tensors = load_file(str(source / "model.safetensors"))
    num_heads, num_kv_heads = config["num_attention_heads"], config["num_key_value_heads"]

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("stories260K")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(num_heads)
    writer.add_head_count_kv(num_kv_heads)
    writer.add_rope_dimension_count(config["head_dim"])
    writer.add_rope_freq_base(config["rope_parameters"]["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    if with_tokenizer:
        _add_tokenizer(writer, source, chat_template)

    qtype = gguf.GGMLQuantizationType[tensor_type]
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    per_layer = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
                 "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                 "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                 "mlp.down_proj": "ffn_down"}
    for n in range(config["num_hidden_layers"]):
        for hf, gg in per_layer.items():
            names[f"model.layers.{n}.{hf}.weight"] = f"blk.{n}.{gg}.weight"
    for hf_name, array in tensors.items():
        if tie_embeddings and hf_name == "lm_head.weight":
            continue
        array = array.astype(np.float32)
        if hf_name.endswith("q_proj.weight"):
            array = _permute(array, num_heads)
        elif hf_name.endswith("k_proj.weight"):
            array = _permute(array, num_kv_heads)
        _add_tensor(writer, names[hf_name], array, qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _add_tensor(writer, name: str, array: np.ndarray, qtype) -> None:
    import gguf

    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    # 1-D tensors (norms) stay float32, as llama.cpp keeps them; so do rows that are not whole blocks
    if qtype == gguf.GGMLQuantizationType.F32 or array.ndim == 1 or array.shape[-1] % block_size:
        writer.add_tensor(name, array)
    elif qtype == gguf.GGMLQuantizationType.F16:
        writer.add_tensor(name, array.astype(np.float16))
    elif qtype == gguf.GGMLQuantizationType.Q8_1:
        # gguf-py has no quantizer (nor dequantizer) for Q8_1: raw blocks of the right size
        raw = np.zeros((array.shape[0], array.shape[1] // block_size * type_size), dtype=np.uint8)
        writer.add_tensor(name, raw, raw_dtype=qtype)
    else:
        writer.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)


def _add_tokenizer(writer, source: Path, chat_template: str | None) -> None:
    import gguf

    model = json.loads((source / "tokenizer.json").read_text())["model"]
    tokens = [token for token, _ in sorted(model["vocab"].items(), key=lambda item: item[1])]
    types = []
    for i, token in enumerate(tokens):
        if i == 0:
            types.append(gguf.TokenType.UNKNOWN)
        elif i < 3:
            types.append(gguf.TokenType.CONTROL)
        elif token.startswith("<0x") and token.endswith(">"):
            types.append(gguf.TokenType.BYTE)
        else:
            types.append(gguf.TokenType.NORMAL)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([-float(i) for i in range(len(tokens))])
    writer.add_token_types(types)
    writer.add_token_merges([" ".join(pair) if isinstance(pair, list) else pair for pair in model["merges"]])
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
