"""BatchInvariantPolicy: the peers' approach to determinism, kept as a baseline to measure DVR against.

SGLang's deterministic mode, vLLM's batch invariance and Thinking Machines'
batch-invariant ops make every kernel reduce in one order whatever the batch,
so a row's result is the same bits in any batch, at any batch size: every
request is reproducible, and every request pays for the slower kernels. LLM-42
(and llm42) instead keeps the fast kernels and verifies only the requests that
asked for determinism; the benchmarks (``llm42.bench``) compare the two.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from llm42.inputs import StepInputs
from llm42.ops import flash
from llm42.policies.base import ExactRowOps
from llm42.policies.fixed_shape import DEFAULT_KEY_CHUNK, FixedShapePolicy


def _check_positive(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"BatchInvariantPolicy {name} must be an int, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"BatchInvariantPolicy {name} must be >= 1, got {value}")
    return value


def _row_tiled(fn: Callable[[torch.Tensor], torch.Tensor], rows: torch.Tensor, tile: int) -> torch.Tensor:
    """Apply ``fn`` to ``rows`` [M, K] in tiles of exactly ``tile`` rows (the last one zero-padded).

    Every call sees a freshly allocated [tile, K] buffer: one shape and one
    alignment whatever M is, so where the kernel is position invariant (at a
    fixed shape it gives a row the same bits wherever it sits: cuBLAS, and the
    canonical pass's CUDA norm) each row's result is independent of M and of
    the other rows.
    """
    num_rows = rows.shape[0]
    if num_rows == 0:
        return fn(rows)
    outs = []
    for start in range(0, num_rows, tile):
        chunk = rows[start: start + tile]
        buf = rows.new_zeros((tile, rows.shape[1]))
        buf[: chunk.shape[0]] = chunk
        outs.append(fn(buf)[: chunk.shape[0]])
    return torch.cat(outs) if len(outs) > 1 else outs[0]


class BatchInvariantPolicy(ExactRowOps):
    """Every op batch-invariant at any batch size: a row's output never depends on the rest of the batch.

    On the CPU every op is the canonical pass's (``FixedShapePolicy``), built
    from ``llm42.ops.exact``: exact-accumulation GEMMs, exact sums in RMSNorm
    and softmax, exp and SiLU from correctly rounded primitives. A row's bits
    are a function of that row's numbers alone, at every batch size including
    1, whatever the layout, thread count, instruction set or CPU vendor; no row
    tiles are needed (``matmul_rows`` and ``norm_rows`` act on CUDA only).

    On CUDA:

    - GEMMs: a persistent Triton matmul with fixed tiles and no split-K
      (``llm42.kernels.batch_invariant_matmul``), the peers' kernel; with
      ``matmul="tiled"``, rows cut into tiles of ``matmul_rows`` rows, each
      multiplied by cuBLAS at that one fixed shape (position invariance, O2).
    - RMSNorm: rows in tiles of ``norm_rows`` rows at one fixed shape, through
      the canonical pass's row-per-program norm.
    - Attention: the canonical pass's attention — one KV split, key blocks of
      ``key_block`` positions aligned at position 0, each row reduced on its
      own — which depends on nothing but the row's own query and keys
      (``attention_kernel``: the canonical pass's ``"tiled"`` kernel or its
      one-program-per-row ``"rows"`` kernel, as ``FixedShapePolicy``). Decode
      steps take the tiled kernel one row per program
      (``tiled_canonical_decode_attention``: the same bits, without packing
      rows of different sequences into one program, which runs them in turn).
    - Row ops (residual add, RoPE, K/V writes, SwiGLU): the unfused torch
      composition (``TorchRowOps``), row-wise elementwise kernels.

    ``is_shape_closed`` is False: launch shapes follow the batch, so this can
    never be a canonical policy. It is a *fast* policy whose outputs are
    nonetheless reproducible; a generator using it needs no verification.
    """

    name = "batch_invariant"
    is_shape_closed = False
    is_graph_safe = True

    def __init__(self, *, matmul_rows: int = 32, norm_rows: int = 256, key_block: int = 64,
                 matmul: str = "auto", attention_kernel: str = "tiled", key_chunk: int = DEFAULT_KEY_CHUNK,
                 tile_m: int = 64):
        self.matmul_rows = _check_positive("matmul_rows", matmul_rows)
        self.norm_rows = _check_positive("norm_rows", norm_rows)
        if matmul not in ("auto", "tiled"):
            raise ValueError(f"BatchInvariantPolicy matmul must be 'auto' or 'tiled', got {matmul!r}")
        self.matmul = matmul
        self._reference = FixedShapePolicy(key_block=key_block, attention_backend="triton",
                                           attention_kernel=attention_kernel, key_chunk=key_chunk, tile_m=tile_m)

    @property
    def key_block(self) -> int:
        return self._reference.key_block

    @property
    def tile_m(self) -> int:
        return self._reference.tile_m

    @property
    def attention_kernel(self) -> str:
        return self._reference.attention_kernel

    def matmul_backend(self, device: torch.device | str) -> str:
        """Which GEMM runs for tensors on ``device``: 'triton', 'tiled' (CUDA) or 'exact' (elsewhere)."""
        if torch.device(device).type != "cuda":
            return "exact"
        return "triton" if self.matmul == "auto" else "tiled"

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        # x: [..., K]; weight: [N, K]
        backend = self.matmul_backend(x.device)
        if backend == "exact":
            return self._reference.linear(x, weight, bias)
        if backend == "triton":
            from llm42.kernels.batch_invariant_matmul import matmul  # needs Triton: imported on CUDA only

            return matmul(x, weight, bias)
        rows = x.reshape(-1, x.shape[-1])
        out = _row_tiled(lambda buf: F.linear(buf, weight, bias), rows, self.matmul_rows)
        return out.view(*x.shape[:-1], weight.shape[0])

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        # x: [..., H]
        if not x.is_cuda:
            return self._reference.rms_norm(x, weight, eps)
        rows = x.reshape(-1, x.shape[-1])
        out = _row_tiled(lambda buf: self._reference.rms_norm(buf, weight, eps), rows, self.norm_rows)
        return out.view(*x.shape[:-1], out.shape[-1])

    def attention(self, q, k_cache, v_cache, inputs: StepInputs, *, block_size, scale, sliding_window):
        if q.is_cuda and inputs.is_decode and self.attention_kernel == "chunked":
            from llm42 import kernels  # the packed launch's bits, each row's chunks in parallel

            return kernels.chunked_canonical_decode_attention(
                q, k_cache, v_cache, inputs.block_tables, inputs.context_lens, block_size=block_size, scale=scale,
                max_context_len=inputs.max_context_len, key_block=self.key_block, key_chunk=self._reference.key_chunk,
                sliding_window=sliding_window, tile_m=self.tile_m)
        if q.is_cuda and inputs.is_decode and self.attention_kernel == "tiled" and not flash.use_flash(
                self._reference.attention_backend, q, k_cache, v_cache, block_size=block_size):
            # the same bits as the packed canonical launch (each row's bits are its own), one program per row
            # instead of 64 / G decode rows of different sequences run one after another in each program
            from llm42 import kernels

            return kernels.tiled_canonical_decode_attention(
                q, k_cache, v_cache, inputs.block_tables, inputs.context_lens, block_size=block_size, scale=scale,
                key_block=self.key_block, sliding_window=sliding_window, tile_m=self.tile_m)
        return self._reference.attention(
            q, k_cache, v_cache, inputs, block_size=block_size, scale=scale, sliding_window=sliding_window
        )

    def process_logits(self, logits: torch.Tensor, inputs: StepInputs) -> torch.Tensor:
        return logits

    def __repr__(self) -> str:
        return (f"BatchInvariantPolicy(matmul_rows={self.matmul_rows}, norm_rows={self.norm_rows}, "
                f"key_block={self.key_block}, matmul={self.matmul!r}"
                + ("" if self.attention_kernel == "tiled" else f", attention_kernel={self.attention_kernel!r}")
                + (f", key_chunk={self._reference.key_chunk}" if self.attention_kernel == "chunked" else "")
                + ("" if self.tile_m == 64 else f", tile_m={self.tile_m}") + ")")
