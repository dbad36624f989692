"""The roofline bound of a request set: the least time any engine needs for it on this device.

Two terms, each at a ceiling measured in the same run (``devicetime.measure_ceilings``):

- **prefill**: matrix FLOPs over every prompt token (2 x the layers' matrix
  parameters per token), the output head for each prompt's last row, and
  causal attention (4 x layers x heads x head_dim x n(n+1)/2 per prompt of n
  tokens), at the measured GEMM rate;
- **decode**: every output token after the first is one decode row. Steps read
  the weights once each; at least max(longest output - 1, decode rows /
  ``max_num_seqs``) steps are needed. Each row at position p reads p + 1
  positions of K/V. Bytes (weights x steps + K/V) at the measured copy
  bandwidth, or the rows' matrix FLOPs at the GEMM rate, whichever is larger.

``bound_s`` is their sum (prefill and decode each at its own ceiling, not
overlapped), ``output_tokens_per_s`` the request set's output tokens over it.

``serial_bound_s`` is the least time for an engine whose step runs its GEMMs and then its attention, one
after the other, as llm42's does (and most engines'): the decode term becomes the GEMMs' time (their FLOPs at
the GEMM rate, or the weights read once a step at the bandwidth, whichever is longer) plus the K/V reads at
the bandwidth, where ``bound_s`` takes the larger of all the reads and the GEMMs, as if they overlapped
(``serial_output_tokens_per_s``: output tokens over it).
"""

from __future__ import annotations

import math

import torch

from llm42.bench.workloads import Workload
from llm42.model.config import ModelConfig
from llm42.model.weights import Weights


def _tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def model_sizes(weights: Weights, cfg: ModelConfig) -> dict:
    """Bytes a decode step reads (layers + final norm + head) and matrix parameters per token."""
    layer_tensors = [t for lw in weights.layers for t in vars(lw).values() if isinstance(t, torch.Tensor)]
    layer_matrix_params = sum(t.numel() for t in layer_tensors if t.dim() == 2)
    head = weights.lm_head
    return {
        "weight_bytes_per_step": sum(map(_tensor_bytes, layer_tensors)) + _tensor_bytes(head)
        + _tensor_bytes(weights.norm),
        "layer_matrix_params": layer_matrix_params,
        "head_params": head.numel(),
        "kv_bytes_per_token": 2 * cfg.num_layers * cfg.kv_size * weights.dtype.itemsize,
    }


def roofline(workload: Workload, weights: Weights, cfg: ModelConfig, *, copy_GBps: float, matmul_TFLOPs: float,
             max_num_seqs: int) -> dict:
    sizes = model_sizes(weights, cfg)
    prompts = [len(r.prompt) for r in workload.requests]
    outputs = [r.max_new_tokens for r in workload.requests]
    num_input = sum(prompts)
    attention_flops = sum(4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * n * (n + 1) / 2 for n in prompts)
    prefill_flops = 2 * sizes["layer_matrix_params"] * num_input + 2 * sizes["head_params"] * len(prompts) \
        + attention_flops
    decode_rows = sum(max(0, m - 1) for m in outputs)
    # rows at positions n .. n + m - 2 read n + 1 .. n + m - 1 positions
    kv_positions = sum((m - 1) * (n + 1) + (m - 1) * (m - 2) / 2 for n, m in zip(prompts, outputs) if m > 1)
    num_steps = max(max((m - 1 for m in outputs), default=0), math.ceil(decode_rows / max_num_seqs))
    decode_bytes = num_steps * sizes["weight_bytes_per_step"] + kv_positions * sizes["kv_bytes_per_token"]
    decode_flops = 2 * (sizes["layer_matrix_params"] + sizes["head_params"]) * decode_rows
    gemm, bandwidth = matmul_TFLOPs * 1e12, copy_GBps * 1e9
    prefill_s = prefill_flops / gemm
    decode_memory_s, decode_compute_s = decode_bytes / bandwidth, decode_flops / gemm
    decode_s = max(decode_memory_s, decode_compute_s)
    bound_s = prefill_s + decode_s
    weights_s = num_steps * sizes["weight_bytes_per_step"] / bandwidth
    kv_s = kv_positions * sizes["kv_bytes_per_token"] / bandwidth
    serial_bound_s = prefill_s + max(decode_compute_s, weights_s) + kv_s
    return {
        **sizes,
        "num_requests": workload.num_requests,
        "input_tokens": num_input,
        "output_tokens": sum(outputs),
        "prefill_flops": prefill_flops,
        "prefill_s": prefill_s,
        "decode_rows": decode_rows,
        "decode_min_steps": num_steps,
        "decode_bytes": decode_bytes,
        "decode_memory_s": decode_memory_s,
        "decode_flops": decode_flops,
        "decode_compute_s": decode_compute_s,
        "decode_bound_by": "memory" if decode_memory_s >= decode_compute_s else "compute",
        "decode_s": decode_s,
        "bound_s": bound_s,
        "output_tokens_per_s": sum(outputs) / bound_s if bound_s > 0 else None,
        "decode_kv_s": kv_s,
        "serial_bound_s": serial_bound_s,
        "serial_output_tokens_per_s": sum(outputs) / serial_bound_s if serial_bound_s > 0 else None,
        "ceilings": {"copy_GBps": copy_GBps, "matmul_TFLOPs": matmul_TFLOPs},
    }
