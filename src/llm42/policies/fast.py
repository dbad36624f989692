"""FastPolicy: any shape, the fastest kernels available. Its results may drift with the batch."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from llm42.engine.config import check_tile_m
from llm42.inputs import StepInputs
from llm42.ops import flash
from llm42.ops.attention import padded_attention
from llm42.policies.base import FusedRowOps
from llm42.ops.norm import rms_norm

DECODE_KERNELS = ("split", "canonical", "deterministic")  # FastPolicy(decode_kernel=...) on CUDA
# decode_kernel="canonical" takes a batch that fills two waves of programs with one split each (where it was
# measured, round 4), whatever wave count the split kernel itself aims at (DECODE_SPLIT_WAVES)
CANONICAL_DECODE_WAVES = 2


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

    ``decode_kernel``: ``"split"`` (default) is the split-KV decode kernel above.
    ``"canonical"`` gives decode steps the canonical tiled kernel's bits
    (``tiled_canonical_decode_attention``, one row per tile, ``canonical_key_block``
    keys per block: set it to the canonical pass's ``key_block``) wherever a batch
    fills two waves of programs over the SMs with one split each, i.e. the batch
    alone fills the GPU;
    smaller batches keep the split kernel. A deterministic request's fast tokens
    then agree with the canonical pass on attention, and roll back only where
    the GEMMs' or norms' drift flips them.
    ``"deterministic"``: the same bits for the decode rows of deterministic
    requests only, at every batch size (``StepInputs.deterministic_rows``, which
    the engine's decode state sets); the other rows keep the split kernel. Each
    of the two kernels skips the other's rows, so a free request's row gets the
    split kernel's bits; the canonical launch runs on a stream of its own beside
    the split kernel (its one-row tiles cannot split a long context). Set
    ``canonical_key_block`` to the canonical policy's ``key_block``. Measured on the
    H200 (docs/benchmarks.md, "Measured, round 11"): on SmolLM2 it removes nearly
    every rollback (1.46 -> 0.01 per deterministic request at dvr@10, 3.05 -> 0.22
    at dvr@50) and cuts the run's steps by 10-25 %, but each step with deterministic
    rows costs 1.4-1.5x (their whole-context serial programs), so the throughput
    is lower than the default's; an option, not the default.
    ``canonical_key_chunk``: set it to the canonical policy's ``key_chunk`` when that
    policy runs the chunked kernel (``FixedShapePolicy(attention_kernel="chunked")``):
    the deterministic rows then take that kernel's bits, each row's chunks in parallel
    (``chunked_canonical_decode_attention``), so a long context no longer makes the
    step wait for one program. Measured on the H200 (round 14) it is dearer still in a
    full batch (256 rows at 2,400 positions, 10 % deterministic: 6.70 ms against the
    one-row launch's 6.38 and the split kernel's 4.56): an option, not the default.
    ``canonical_tile_m``: set it to the canonical policy's ``tile_m`` (64 or 128) with either option.
    """

    name = "fast"
    is_shape_closed = False
    is_graph_safe = True  # no host syncs or host-side state: decode steps may be CUDA-graph captured
    attention_backend = "auto"  # also what subclasses that do not call __init__ get

    decode_kernel = "split"
    canonical_key_block = 64

    canonical_key_chunk = None
    canonical_tile_m = 64

    def __init__(self, *, attention_backend: str = "auto", decode_kernel: str = "split",
                 canonical_key_block: int = 64, canonical_key_chunk: int | None = None, canonical_tile_m: int = 64):
        self.attention_backend = flash.check_backend(attention_backend)
        if decode_kernel not in DECODE_KERNELS:
            raise ValueError(f"decode_kernel must be one of {DECODE_KERNELS}, got {decode_kernel!r}")
        if (not isinstance(canonical_key_block, int) or isinstance(canonical_key_block, bool)
                or canonical_key_block < 16 or canonical_key_block & (canonical_key_block - 1)):
            raise ValueError(f"canonical_key_block must be a power of two >= 16, got {canonical_key_block!r}")
        self.decode_kernel = decode_kernel
        self.canonical_key_block = canonical_key_block
        if canonical_key_chunk is not None:
            from llm42.policies.fixed_shape import check_key_chunk

            check_key_chunk("FastPolicy", canonical_key_chunk, canonical_key_block)
        self.canonical_key_chunk = canonical_key_chunk
        self.canonical_tile_m = check_tile_m("FastPolicy", "canonical_tile_m", canonical_tile_m)

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return F.linear(x, weight, bias)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if x.is_cuda:
            from llm42 import kernels

            return kernels.rms_norm(x, weight, eps)
        return rms_norm(x, weight, eps)

    def attention(self, q, k_cache, v_cache, inputs: StepInputs, *, block_size, scale, sliding_window):
        is_decode = inputs.is_decode
        if flash.use_flash(self.attention_backend, q, k_cache, v_cache, block_size=block_size) and is_decode:
            return flash.decode_attention(q, k_cache, v_cache, inputs.block_tables, inputs.context_lens,
                                          block_size=block_size, scale=scale, sliding_window=sliding_window)
        if q.is_cuda:
            from llm42 import kernels

            flags = inputs.deterministic_rows
            if is_decode and self.decode_kernel == "deterministic" and flags is not None:
                # the two launches side by side: the deterministic rows' one-row-per-tile launch cannot split a
                # long context (its programs run the whole key range in turn), so on a stream of its own it runs
                # beside the split kernel's programs instead of after them (and costs a batch without such rows
                # nothing). Each writes only its rows of ``out``; the caller's stream waits for both
                out = torch.empty_like(q)
                main = torch.cuda.current_stream(q.device)
                side = self._side_stream(q.device)
                side.wait_stream(main)
                with torch.cuda.stream(side):
                    self._canonical_decode(q, k_cache, v_cache, inputs, block_size=block_size, scale=scale,
                                           sliding_window=sliding_window, only_rows=flags, out=out)
                kernels.paged_decode_attention(
                    q, k_cache, v_cache, inputs.block_tables, inputs.context_lens, block_size=block_size,
                    scale=scale, sliding_window=sliding_window, max_context_len=inputs.max_context_len,
                    skip_rows=flags, out=out, order=_decode_order(inputs),
                )
                main.wait_stream(side)
                return out
            if is_decode and self.decode_kernel == "canonical" and kernels.choose_num_splits(
                    inputs.num_seqs, k_cache.shape[1], inputs.max_context_len, num_sms=kernels.num_sms(q.device),
                    block_n=kernels.attention.DECODE_BLOCK_N, waves=CANONICAL_DECODE_WAVES) == 1:
                return self._canonical_decode(q, k_cache, v_cache, inputs, block_size=block_size, scale=scale,
                                              sliding_window=sliding_window)
            if is_decode:
                return kernels.paged_decode_attention(
                    q, k_cache, v_cache, inputs.block_tables, inputs.context_lens, block_size=block_size,
                    scale=scale, sliding_window=sliding_window, max_context_len=inputs.max_context_len,
                    order=_decode_order(inputs),
                )
            # prompt chunks (and mixed steps): query tiles of one sequence share each key block's loads
            return kernels.tiled_prefill_attention(
                q, k_cache, v_cache, inputs.positions, inputs.shared_table_rows, inputs.block_tables,
                block_size=block_size, scale=scale, sliding_window=sliding_window,
            )
        return padded_attention(
            q, k_cache, v_cache, inputs, block_size=block_size, scale=scale, sliding_window=sliding_window
        )

    @property
    def wants_deterministic_rows(self) -> bool:
        """Whether decode steps should carry ``StepInputs.deterministic_rows`` (the decode state reads this)."""
        return self.decode_kernel == "deterministic"

    def _canonical_decode(self, q, k_cache, v_cache, inputs: StepInputs, *, block_size, scale, sliding_window,
                          only_rows=None, out=None):
        """Decode rows with the canonical pass's attention bits: the tiled kernel's one-row launch, or with
        ``canonical_key_chunk`` the chunked kernel's (each row's chunks in parallel)."""
        from llm42 import kernels

        if self.canonical_key_chunk is None:
            return kernels.tiled_canonical_decode_attention(
                q, k_cache, v_cache, inputs.block_tables, inputs.context_lens, block_size=block_size, scale=scale,
                key_block=self.canonical_key_block, sliding_window=sliding_window, only_rows=only_rows, out=out,
                tile_m=self.canonical_tile_m)
        return kernels.chunked_canonical_decode_attention(
            q, k_cache, v_cache, inputs.block_tables, inputs.context_lens, block_size=block_size, scale=scale,
            max_context_len=inputs.max_context_len, key_block=self.canonical_key_block,
            key_chunk=self.canonical_key_chunk, sliding_window=sliding_window, only_rows=only_rows, out=out,
            tile_m=self.canonical_tile_m)

    def _side_stream(self, device: torch.device) -> torch.cuda.Stream:
        """The stream the deterministic rows' attention runs on (one per device, made on first use)."""
        streams = self.__dict__.setdefault("_side_streams", {})
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index not in streams:
            streams[index] = torch.cuda.Stream(device=index)
        return streams[index]

    def process_logits(self, logits: torch.Tensor, inputs: StepInputs) -> torch.Tensor:
        return logits

    def __repr__(self) -> str:
        args = [] if self.attention_backend == "auto" else [f"attention_backend={self.attention_backend!r}"]
        if self.decode_kernel != "split":
            args.append(f"decode_kernel={self.decode_kernel!r}, canonical_key_block={self.canonical_key_block}")
            if self.canonical_key_chunk is not None:
                args.append(f"canonical_key_chunk={self.canonical_key_chunk}")
            if self.canonical_tile_m != 64:
                args.append(f"canonical_tile_m={self.canonical_tile_m}")
        return f"{type(self).__name__}({', '.join(args)})"


def _decode_order(inputs: StepInputs) -> torch.Tensor | None:
    """The order the split decode kernel dispatches the step's sequences in (longest context first; the bits do
    not depend on it), or None where ``kernels.attention.DECODE_LONGEST_FIRST`` is off."""
    from llm42.kernels import attention

    return inputs.decode_order if attention.DECODE_LONGEST_FIRST else None


def canonical_decode_mismatches(fast: object, canonical: object) -> list[str]:
    """Where a ``FastPolicy`` whose decode rows take the canonical attention's bits (``decode_kernel`` "canonical" or
    "deterministic") names another canonical attention than ``canonical`` (a ``FixedShapePolicy``) runs: one line
    per field that differs. Those rows then agree with the canonical pass less often (more rollbacks); the
    contract does not depend on it. Empty for the split kernel, and for other policies."""
    from llm42.policies.fixed_shape import FixedShapePolicy

    if not isinstance(fast, FastPolicy) or fast.decode_kernel == "split" or not isinstance(canonical, FixedShapePolicy):
        return []
    out = []
    if fast.canonical_key_block != canonical.key_block:
        out.append(f"FastPolicy canonical_key_block={fast.canonical_key_block}, FixedShapePolicy "
                   f"key_block={canonical.key_block}")
    if fast.canonical_tile_m != canonical.tile_m:
        out.append(f"FastPolicy canonical_tile_m={fast.canonical_tile_m}, FixedShapePolicy tile_m={canonical.tile_m}")
    chunk = canonical.key_chunk if canonical.attention_kernel == "chunked" else None
    if fast.canonical_key_chunk != chunk:
        out.append(f"FastPolicy canonical_key_chunk={fast.canonical_key_chunk}, FixedShapePolicy "
                   f"attention_kernel={canonical.attention_kernel!r}"
                   + (f", key_chunk={canonical.key_chunk}" if chunk is not None else ""))
    elif canonical.attention_kernel == "rows" or canonical.attention_backend != "triton":
        out.append(f"FixedShapePolicy attention_kernel={canonical.attention_kernel!r}, attention_backend="
                   f"{canonical.attention_backend!r}: not the tiled kernel the decode rows run")
    return out

