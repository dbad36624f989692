"""FastPolicy: any shape, the fastest kernels available. Its results may drift with the batch."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from llm42.inputs import StepInputs
from llm42.ops import flash
from llm42.ops.attention import padded_attention
from llm42.policies.base import FusedRowOps
from llm42.ops.norm import rms_norm


class FastPolicy(FusedRowOps):
    """The fast path: dynamic batches, library GEMMs, the fastest attention for the step.

    On the CPU: padded SDPA. On CUDA: the Triton split-KV decode kernel when
    every sequence has one query row (its split count follows the batch and
    context), otherwise the Triton tiled prefill kernel (``tiled_prefill_attention``:
    query tiles of one sequence, each key block loaded once per tile); RMSNorm and the row ops (residual
    add + RMSNorm, RoPE + K/V write, SwiGLU) are fused Triton kernels.

    ``attention_backend``: ``"auto"`` sends decode steps to flash-attn's
    ``flash_attn_with_kvcache`` (default split heuristic) when ``flash_attn``
    imports and can serve them (CUDA, fp16/bf16, ``block_size`` a multiple of
    256: ``llm42.ops.flash.unsupported``), else the kernels above run;
    ``"triton"`` never uses flash-attn; ``"flash"`` needs ``flash_attn`` to
    import (ValueError here otherwise) and raises at a call it cannot serve.
    Steps with prefill rows always take the kernels above.
    """

    name = "fast"
    is_shape_closed = False
    is_graph_safe = True  # no host syncs or host-side state: decode steps may be CUDA-graph captured
    attention_backend = "auto"  # also what subclasses that do not call __init__ get

    def __init__(self, *, attention_backend: str = "auto"):
        self.attention_backend = flash.check_backend(attention_backend)

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return F.linear(x, weight, bias)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if x.is_cuda:
            from llm42 import kernels

            return kernels.rms_norm(x, weight, eps)
        return rms_norm(x, weight, eps)

    def attention(self, q, k_cache, v_cache, inputs: StepInputs, *, block_size, scale, sliding_window):
        # decode: one query row per sequence, in sequence order. Staged prompt chunks (FastPrefill) also give
        # each row its own "sequence", but carry table_rows saying which rows share one: not decode
        is_decode = inputs.num_rows == inputs.num_seqs and inputs.table_rows is None
        if flash.use_flash(self.attention_backend, q, k_cache, v_cache, block_size=block_size) and is_decode:
            return flash.decode_attention(q, k_cache, v_cache, inputs.block_tables, inputs.context_lens,
                                          block_size=block_size, scale=scale, sliding_window=sliding_window)
        if q.is_cuda:
            from llm42 import kernels

            if is_decode:
                return kernels.paged_decode_attention(
                    q, k_cache, v_cache, inputs.block_tables, inputs.context_lens, block_size=block_size,
                    scale=scale, sliding_window=sliding_window, max_context_len=inputs.max_context_len,
                )
            # prompt chunks (and mixed steps): query tiles of one sequence share each key block's loads
            return kernels.tiled_prefill_attention(
                q, k_cache, v_cache, inputs.positions, inputs.shared_table_rows, inputs.block_tables,
                block_size=block_size, scale=scale, sliding_window=sliding_window,
            )
        return padded_attention(
            q, k_cache, v_cache, inputs, block_size=block_size, scale=scale, sliding_window=sliding_window
        )

    def process_logits(self, logits: torch.Tensor, inputs: StepInputs) -> torch.Tensor:
        return logits

    def __repr__(self) -> str:
        backend = "" if self.attention_backend == "auto" else f"attention_backend={self.attention_backend!r}"
        return f"{type(self).__name__}({backend})"
