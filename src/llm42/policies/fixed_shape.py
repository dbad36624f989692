"""FixedShapePolicy: the canonical pass's kernels, each with one fixed reduction schedule."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from llm42.engine.config import check_tile_m, positive_int
from llm42.inputs import StepInputs
from llm42.ops import exact, flash
from llm42.ops.attention import blocked_attention
from llm42.policies.base import ExactRowOps, FusedRowOps

if TYPE_CHECKING:
    from llm42.distributed.group import TensorParallel
    from llm42.model.weights import Weights

# the Triton canonical attention kernels (CUDA; part of the canonical config). "tiled_masked" is "tiled" with
# every key block through the masked step: the same bits, slower (the reference the GPU suite compares with)
# "chunked": the tiled kernel's steps within chunks of ``key_chunk`` keys fixed by absolute position, folded in order
# (``llm42.kernels.chunked_attention``: other committed bits; a decode row's chunks can run in parallel)
ATTENTION_KERNELS = ("tiled", "tiled_masked", "rows", "chunked")
DEFAULT_KEY_CHUNK = 512  # keys per chunk of the "chunked" kernel (part of the canonical config there)
# the canonical GEMM on CUDA (part of the canonical config; FixedShapePolicy's docstring says what each is)
GEMMS = ("cublas", "triton")


class FixedShapePolicy(ExactRowOps, FusedRowOps):
    """Kernels for the canonical pass.

    Attention uses one KV split and key blocks of ``key_block`` positions
    aligned at position 0, so no reduction depends on context lengths or on
    the other rows.

    On the CPU every op is ``llm42.ops.exact``'s: GEMMs (linear and attention's
    q·k, p·v) accumulate integer slices exactly in float64, RMSNorm and softmax
    sums are exact sums, exp and SiLU are built from correctly rounded + - * /
    only. A row's
    bits are then a function of that row's numbers alone — not of the layout,
    the number of rows, the thread count, the instruction set or the CPU
    vendor, whatever MKL or ATen choose (their own kernels give a row
    different bits by its position on AVX2 and SSE4.2 code paths). Each
    weight's slices are computed once and cached (``slices``: by default
    ``exact.SHARED_WEIGHT_SLICES``, shared by every policy in the process).

    On CUDA: library GEMMs at M = R rows, relying on position invariance
    (observation O2: at a fixed shape cuBLAS gives a row the same bits wherever
    it sits), the Triton tiled canonical attention kernel
    (``tiled_canonical_attention``: query tiles of one sequence share each key
    block's loads, a row's bits are its own; ``key_block`` a power of two >= 16;
    ``attention_kernel="rows"`` takes the one-program-per-row kernel of earlier
    versions instead, whose committed bits differ; ``"tiled_masked"`` the tiled
    kernel with every key block masked, the same bits as ``"tiled"``, slower; ``"chunked"`` the tiled kernel's
    steps within chunks of ``key_chunk`` keys cut at fixed absolute positions and folded in order, whose
    committed bits differ from ``"tiled"``'s but whose decode rows can reduce their chunks in parallel with the
    same bits: ``FastPolicy(decode_kernel="deterministic", canonical_key_chunk=key_chunk)``), the fused
    row-per-program RMSNorm and the fused row ops
    (residual add + RMSNorm, RoPE + K/V write, SwiGLU: row-wise, launched over
    the R rows, each row's arithmetic fixed by the feature sizes alone).

    ``attention_backend``: ``"triton"`` (the default) never uses flash-attn:
    the kernels above; ``"auto"`` runs attention through flash-attn's
    ``flash_attn_with_kvcache`` with ``num_splits=1`` (batch = the R rows, one
    query each; ``key_block`` then plays no part) when ``flash_attn`` imports
    and can serve the pass (CUDA, fp16/bf16, ``block_size`` a multiple of 256),
    else the kernels above; ``"flash"`` needs ``flash_attn`` to import
    (ValueError here otherwise) and raises at a pass it cannot serve. The
    backend decides the committed bits, so it is part of the canonical config:
    the default is explicit so that installing flash-attn never changes a
    deterministic request's output behind the user's back.

    ``gemm`` (CUDA; part of the canonical config): ``"cublas"`` (the default) the library GEMM at M = R
    above; ``"triton"`` the persistent batch-invariant Triton matmul (``llm42.kernels.batch_invariant_matmul``:
    tiles fixed per dtype, K walked in order by one program per output tile, no split-K), whose every row
    is its own at any number of rows, so a wide pass runs each linear in one launch over all its rows
    instead of one cuBLAS call per R-row block (``is_gemm_row_invariant``). Its committed bits differ from
    ``"cublas"``'s on CUDA; on the CPU both run the exact GEMM (the same bits).

    ``gemm_rows`` (CUDA, with ``gemm="cublas"``; part of the canonical config): every GEMM of the pass at M =
    ``gemm_rows`` rows instead of M = R: a linear of n rows runs as blocks of exactly ``gemm_rows`` rows, the last
    one padded with zero rows (``fixed_row_blocks``), so a row's bits are its own at any n (observation O2 at M =
    ``gemm_rows``; ``is_gemm_row_invariant``) and a wide pass runs a few large library GEMMs instead of one per
    R-row block, each writing its rows of one output (``mm`` / ``addmm`` with ``out=``: no concatenation). On a
    small model, whose GEMMs are launch- and latency-bound at these M, one cuBLAS call of 2,048 rows costs about
    what one of 256 does (SmolLM2's layer, round 25: 31.7 against 15.5-21.1 us) while a wide pass runs eight; on a
    large one padding rows cost FLOPs, so ``None`` (the default, M = R) stays the choice there. ``CanonicalPass``
    sizes its buckets in multiples of it where they fit (no padding rows in a captured pass's layers), and checks
    the premise on the device when it is built (``check_gemm_rows``: a row's bits at another position among N rows,
    for each of the model's GEMM shapes; RuntimeError where they move). Other committed bits than ``None``'s
    (another M); on the CPU every GEMM is the exact one (the same bits whatever it is).

    ``tile_m`` (CUDA; part of the canonical config): the tiled canonical attention's tile height in M-rows (query
    rows x query heads per kv head), 64 (the default) or 128 (``llm42.engine.config.CANONICAL_TILE_HEIGHTS``); the
    ``"tiled"``, ``"tiled_masked"`` and ``"chunked"`` kernels launch with it. Taller tiles load each key block once
    for twice the rows: cheaper long prompts. On the H200 the two heights gave every row sampled the same bits (docs/gpu.md, "The
    canonical tile's height"); the library does not assume that on other GPUs, so each height is its own canonical
    config. Set the fast policy's ``canonical_tile_m`` (``FastPolicy(decode_kernel=...)``) to the same height.
    """

    name = "fixed_shape"
    is_shape_closed = True
    is_graph_safe = True

    def __init__(self, key_block: int = 64, *, attention_backend: str = "triton", attention_kernel: str = "tiled",
                 key_chunk: int = DEFAULT_KEY_CHUNK, gemm: str = "cublas", tile_m: int = 64,
                 gemm_rows: int | None = None):
        self.key_block = positive_int("FixedShapePolicy", "key_block", key_block)
        self.tile_m = check_tile_m("FixedShapePolicy", "tile_m", tile_m)
        if gemm not in GEMMS:
            raise ValueError(f"FixedShapePolicy gemm must be one of {GEMMS}, got {gemm!r}")
        self.gemm = gemm
        if gemm_rows is not None:
            positive_int("FixedShapePolicy", "gemm_rows", gemm_rows)
            if gemm != "cublas":
                raise ValueError(f"FixedShapePolicy gemm_rows fixes the library GEMM's M; gemm={gemm!r}'s rows are "
                                 f"their own at any M already: pass one of them")
        self.gemm_rows = gemm_rows
        if attention_kernel not in ATTENTION_KERNELS:
            raise ValueError(f"attention_kernel must be one of {ATTENTION_KERNELS}, got {attention_kernel!r}")
        self.attention_kernel = attention_kernel
        self.key_chunk = check_key_chunk("FixedShapePolicy", key_chunk, self.key_block)
        self.attention_backend = flash.check_backend(attention_backend)
        self.slices = exact.SHARED_WEIGHT_SLICES

    @property
    def is_gemm_row_invariant(self) -> bool:
        """Whether a wide pass may run each GEMM once over all its rows (``gemm="triton"``, or ``gemm_rows``): a
        row's bits are then its own at any number of rows (the Triton GEMM, or the library GEMM on blocks of
        ``gemm_rows`` rows, on CUDA; the exact GEMM elsewhere), with no R-row blocks."""
        return self.gemm == "triton" or self.gemm_rows is not None

    def _cuda_linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.gemm == "triton":
            from llm42.kernels.batch_invariant_matmul import matmul  # needs Triton: imported on CUDA only

            return matmul(x, weight, bias)
        if self.gemm_rows is not None:
            return fixed_row_blocks(x, self.gemm_rows, weight.shape[0],
                                    lambda block, out: self._library_linear(block, weight, bias, out=out))
        return self._library_linear(x, weight, bias)

    def check_gemm_rows(self, weights: Weights) -> None:
        """With ``gemm_rows`` on a device whose GEMM is the library's (CUDA): check observation O2 at M =
        ``gemm_rows`` on this device for every GEMM shape of ``weights`` (``position_variant_gemms``: random rows
        and the same rows shuffled), and raise ``RuntimeError`` naming ``gemm_rows`` where a row's bits moved with
        its position: the config's premise fails here, and its passes would not commit a row's own bits.
        ``CanonicalPass`` calls it when it is built. A no-op without ``gemm_rows`` or elsewhere (the CPU's
        canonical GEMM is exact)."""
        if self.gemm_rows is None or not self._is_library_device(weights.device):
            return

        def gemm(x, weight, bias):  # the call the blocks make: into an output of its own
            return self._library_linear(x, weight, bias, out=x.new_empty(x.shape[0], weight.shape[0]))

        moved = position_variant_gemms(gemm, weights.linears(), self.gemm_rows)
        if weights.device.type == "cuda":  # the check's outputs (an [N, vocab] head among them) leave no cached
            torch.cuda.empty_cache()  # blocks behind: the K/V store is sized from the free memory after this
        if moved:
            raise RuntimeError(f"FixedShapePolicy gemm_rows={self.gemm_rows}: on {weights.device} the library GEMM "
                               f"gave rows other bits at other positions among {self.gemm_rows} rows for "
                               f"{', '.join(moved)} (observation O2 fails at this M here): leave gemm_rows unset "
                               f"or try another value")

    def _is_library_device(self, device: torch.device) -> bool:
        return device.type == "cuda"

    def _library_linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, *,
                        out: torch.Tensor | None = None) -> torch.Tensor:
        """The library GEMM (cuBLAS on CUDA), at whatever M it is handed; into ``out`` where given (``F.linear``'s
        own calls: ``addmm`` with a bias, ``mm`` without)."""
        if out is None:
            return F.linear(x, weight, bias)
        if bias is None:
            return torch.mm(x, weight.t(), out=out)
        return torch.addmm(bias, x, weight.t(), out=out)

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if x.is_cuda:
            return self._cuda_linear(x, weight, bias)
        return exact.linear(x, weight, bias, slices=self.slices)

    def row_parallel_linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, *,
                            tp: TensorParallel, shard: exact.RowShard | None) -> torch.Tensor:
        """A row-parallel linear (tensor parallelism): this rank's columns, reduced over the ranks.

        On the CPU ``exact.sharded_linear``: the ranks' exact integer partial
        products are all-reduced in float64 and rounded once, so the bits equal
        ``linear`` of the whole weight at one rank (TP-size invariance). On
        CUDA: the ranks' partial library GEMMs at M = R, summed in rank order
        (``TensorParallel.ordered_sum``), position invariant but a function of
        the number of ranks.
        """
        if x.is_cuda:
            out = tp.ordered_sum(self._cuda_linear(x, weight, None))
            return out if bias is None else out + bias
        if shard is None:
            raise ValueError("a row-parallel weight on the CPU needs its RowShard (llm42.distributed.load_shard)")
        return exact.sharded_linear(x, weight, bias, shard=shard, slices=self.slices,
                                    all_reduce_max=tp.all_reduce_max, all_reduce_sum=tp.all_reduce_sum)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if x.is_cuda:
            from llm42 import kernels

            return kernels.rms_norm(x, weight, eps)
        return exact.rms_norm(x, weight, eps)

    def attention(self, q, k_cache, v_cache, inputs: StepInputs, *, block_size, scale, sliding_window):
        if flash.use_flash(self.attention_backend, q, k_cache, v_cache, block_size=block_size):
            return flash.canonical_attention(q, k_cache, v_cache, inputs.positions, inputs.row_seq,
                                             inputs.block_tables, block_size=block_size, scale=scale,
                                             sliding_window=sliding_window)
        if q.is_cuda:
            from llm42 import kernels

            if self.attention_kernel == "chunked":
                return kernels.chunked_canonical_attention(
                    q, k_cache, v_cache, inputs.positions, inputs.shared_table_rows, inputs.block_tables,
                    block_size=block_size, scale=scale, key_block=self.key_block, key_chunk=self.key_chunk,
                    sliding_window=sliding_window, tile_m=self.tile_m,
                )
            if self.attention_kernel == "rows":
                return kernels.canonical_attention(
                    q, k_cache, v_cache, inputs.positions, inputs.row_seq, inputs.block_tables,
                    block_size=block_size, scale=scale, key_block=self.key_block, sliding_window=sliding_window,
                )
            return kernels.tiled_canonical_attention(
                q, k_cache, v_cache, inputs.positions, inputs.shared_table_rows, inputs.block_tables,
                block_size=block_size, scale=scale, key_block=self.key_block, sliding_window=sliding_window,
                mask_every_block=True if self.attention_kernel == "tiled_masked" else None, tiles=inputs.tiles,
                tile_m=self.tile_m,
            )
        return blocked_attention(
            q, k_cache, v_cache, inputs,
            block_size=block_size, scale=scale, key_block=self.key_block, sliding_window=sliding_window,
        )

    def attention_tile_rows(self, num_heads: int, num_kv_heads: int) -> int | None:
        """Rows per tile of the CUDA tiled canonical attention, whose launch takes a tile table staged with
        the pass (``StepInputs.tiles``: each sequence's rows in tiles of their own; the same bits as the fixed
        tiling); None where the attention is another kernel's."""
        if self.attention_kernel not in ("tiled", "tiled_masked") or self.attention_backend == "flash":
            return None
        from llm42.kernels.tiled_attention import canonical_rows_per_tile

        return canonical_rows_per_tile(num_heads // num_kv_heads, self.tile_m)

    def process_logits(self, logits: torch.Tensor, inputs: StepInputs) -> torch.Tensor:
        return logits

    def __repr__(self) -> str:
        backend = "" if self.attention_backend == "triton" else f", attention_backend={self.attention_backend!r}"
        kernel = "" if self.attention_kernel == "tiled" else f", attention_kernel={self.attention_kernel!r}"
        if self.attention_kernel == "chunked":
            kernel += f", key_chunk={self.key_chunk}"
        gemm = "" if self.gemm == "cublas" else f", gemm={self.gemm!r}"
        tile = "" if self.tile_m == 64 else f", tile_m={self.tile_m}"
        rows = "" if self.gemm_rows is None else f", gemm_rows={self.gemm_rows}"
        return f"FixedShapePolicy(key_block={self.key_block}{backend}{kernel}{gemm}{tile}{rows})"


def position_variant_gemms(gemm, linears, rows: int, *, seed: int = 0) -> list[str]:
    """The (name, weight, bias) of ``linears`` for which ``gemm(x, weight, bias)`` of ``rows`` random rows, and of
    the same rows shuffled, gives some row other bits at its other position (observation O2 failing at M =
    ``rows``); each as "name [rows x K] x [N, K]^T". Seeded: the same inputs on every call."""
    moved = []
    for name, weight, bias in linears:
        gen = torch.Generator(device=weight.device).manual_seed(seed)
        x = torch.randn(rows, weight.shape[1], generator=gen, device=weight.device).to(weight.dtype)
        perm = torch.randperm(rows, generator=gen, device=weight.device)
        if not torch.equal(gemm(x[perm], weight, bias), gemm(x, weight, bias)[perm]):
            moved.append(f"{name} [{rows} x {weight.shape[1]}] x [{weight.shape[0]}, {weight.shape[1]}]^T")
    return moved


def fixed_row_blocks(x: torch.Tensor, rows: int, num_out: int, gemm) -> torch.Tensor:
    """A row-wise map (e.g. a linear) of ``x`` [n, K] -> [n, ``num_out``], every call on exactly ``rows`` rows:
    ``gemm(block, out)`` writes ``block``'s [rows, ``num_out``] result into ``out``, a slice of one output buffer
    (no concatenation afterwards), for ``x`` in blocks of ``rows`` rows, the last one padded with zero rows (their
    outputs dropped).

    Where ``gemm`` gives a row the same bits wherever it sits among ``rows`` rows (a library GEMM at one shape:
    observation O2), each row of the result is then a function of that row alone, at any n.
    """
    n = x.shape[0]
    whole = -(-n // rows) * rows
    out = x.new_empty(whole, num_out)
    for start in range(0, n, rows):
        block = x[start: start + rows]
        if block.shape[0] < rows:
            block = F.pad(block, (0, 0, 0, rows - block.shape[0]))
        gemm(block, out[start: start + rows])
    return out if whole == n else out[:n]


def check_key_chunk(owner: str, key_chunk: object, key_block: int) -> int:
    """A chunk of the chunked canonical attention: a positive multiple of ``key_block`` keys."""
    positive_int(owner, "key_chunk", key_chunk)
    if key_chunk % key_block:
        raise ValueError(f"{owner} key_chunk ({key_chunk}) must be a multiple of key_block ({key_block})")
    return key_chunk
