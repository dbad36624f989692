"""Optional attention backend: flash-attn 2's ``flash_attn_with_kvcache`` over llm42's paged cache.

flash-attn is not a dependency (it has no wheel that installs on this
project's machines), so everything here is used only when ``flash_attn``
imports, and only for steps it can serve; the policies fall back to their own
kernels otherwise (see ``use_flash``). It has been checked against a float64
reference of the documented ``flash_attn_with_kvcache`` semantics only
(``tests/test_flash_backend.py``), never against the real package.

It lives in ``llm42.ops`` rather than ``llm42.kernels`` because it needs no
Triton: the policies import it on every device, and ``llm42.kernels`` imports
Triton, which CPU-only installs lack.

Layout mapping. llm42's cache is flat, ``[num_slots, Hkv, D]``, with the slot
of position p of a sequence ``block_table[p // block_size] * block_size + p %
block_size``. Viewed as ``[num_slots // block_size, block_size, Hkv, D]`` it is
exactly flash-attn's paged cache ``(num_blocks, page_block_size, nheads_k,
headdim)`` with the same block table (as int32). Queries are passed as
``(batch, seqlen_q = 1, nheads, headdim)``: every query row is its own batch
element, seeing ``cache_seqlens[b]`` keys, so flash-attn's bottom-right causal
alignment puts it at position ``cache_seqlens[b] - 1``. A sliding window of W
keys (llm42: keys p - W + 1 .. p) is ``window_size = (W - 1, 0)``.

- ``decode_attention`` (fast path): one query row per sequence, batch =
  sequences, ``cache_seqlens = context_lens``, ``num_splits=0`` (flash-attn's
  own split heuristic, which follows the batch, so results drift with it).
- ``canonical_attention`` (canonical pass): batch = the pass's R rows, each
  with its own block-table row and ``cache_seqlens = position + 1``, and
  ``num_splits=1``: one KV split. Every launch argument's shape is a function
  of R, the block-table width and the model (never of which rows are real).

Constraints this module checks (``unsupported``), from flash-attn 2.x's
``flash_attn_with_kvcache``: CUDA tensors; float16 or bfloat16 q and cache, all
the same dtype; ``block_size`` (``page_block_size``) a multiple of 256; head
dim a multiple of 8 and at most 256; query heads a multiple of kv heads; a
contiguous cache whose slot count is a whole number of blocks.
"""

from __future__ import annotations

import functools
import importlib

import torch

BACKENDS = ("auto", "triton", "flash")
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
PAGE_MULTIPLE = 256  # flash-attn 2 paged KV: page_block_size must be divisible by 256
MAX_HEAD_DIM = 256


@functools.lru_cache(maxsize=None)
def _probe() -> str | None:
    """None if ``flash_attn.flash_attn_with_kvcache`` imports, else why not (cached: probed once)."""
    try:
        module = importlib.import_module("flash_attn")
    except Exception as exc:  # a broken build raises more than ImportError (e.g. undefined CUDA symbols)
        return f"{type(exc).__name__}: {exc}"
    if not callable(getattr(module, "flash_attn_with_kvcache", None)):
        return "flash_attn has no flash_attn_with_kvcache (flash-attn 2.x is needed)"
    return None


def is_available() -> bool:
    """Whether ``flash_attn.flash_attn_with_kvcache`` imports (probed once, then cached)."""
    return _probe() is None


def clear_cache() -> None:
    """Forget the cached import probe (for tests that install or remove a ``flash_attn`` module)."""
    _probe.cache_clear()


def check_backend(attention_backend: str) -> str:
    """Validate a policy's ``attention_backend`` argument; ``"flash"`` needs flash_attn to import."""
    if attention_backend not in BACKENDS:
        raise ValueError(f"attention_backend must be one of {BACKENDS}, got {attention_backend!r}")
    if attention_backend == "flash" and not is_available():
        raise ValueError(
            "attention_backend='flash' needs the flash_attn package (flash-attn 2.x, `pip install flash-attn`), "
            f"which does not import here ({_probe()}); use 'auto' or 'triton'"
        )
    return attention_backend


def unsupported(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, *,
                block_size: int) -> tuple[str, ...]:
    """Why flash-attn cannot serve attention over these tensors (empty: it can). Does not check the import."""
    reasons = []
    if not (q.is_cuda and k_cache.is_cuda and v_cache.is_cuda):
        reasons.append("the tensors are not on CUDA")
    if q.dtype not in SUPPORTED_DTYPES or k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        reasons.append(f"dtypes q {q.dtype}, k {k_cache.dtype}, v {v_cache.dtype}: all float16 or all bfloat16 "
                       "is needed")
    if block_size % PAGE_MULTIPLE:
        reasons.append(f"block_size {block_size} is not a multiple of {PAGE_MULTIPLE} (flash-attn 2's paged KV)")
    head_dim = q.shape[-1]
    if head_dim % 8 or head_dim > MAX_HEAD_DIM:
        reasons.append(f"head_dim {head_dim} is not a multiple of 8 at most {MAX_HEAD_DIM}")
    if (q.dim() != 3 or k_cache.dim() != 3 or k_cache.shape != v_cache.shape or k_cache.shape[2] != head_dim
            or q.shape[1] % k_cache.shape[1]):
        reasons.append(f"shapes q {tuple(q.shape)}, k {tuple(k_cache.shape)}, v {tuple(v_cache.shape)} do not fit")
    elif k_cache.shape[0] % block_size or not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        reasons.append("the cache is not a contiguous whole number of blocks")
    return tuple(reasons)


def use_flash(attention_backend: str, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, *,
              block_size: int) -> bool:
    """The policies' dispatch: whether this attention call goes to flash-attn.

    ``"triton"``: never. ``"auto"``: when flash_attn imports and ``unsupported``
    finds nothing, else False (the policy's own kernels run: the explicit
    fallback). ``"flash"``: True, or a ValueError listing why it cannot serve.
    Host-side checks of tensor metadata only: safe inside CUDA graph capture.
    """
    if attention_backend == "triton":
        return False
    if attention_backend == "auto" and not is_available():
        return False
    reasons = unsupported(q, k_cache, v_cache, block_size=block_size)
    if reasons and attention_backend == "flash":
        raise ValueError("attention_backend='flash' cannot serve this attention call: " + "; ".join(reasons))
    return not reasons


def _window_size(sliding_window: int | None) -> tuple[int, int]:
    # llm42: a row at position p sees keys (p - W, p]; flash-attn: [p - left, p + right] with right = 0 (causal)
    return (-1, -1) if sliding_window is None else (int(sliding_window) - 1, 0)


def _paged(cache: torch.Tensor, block_size: int) -> torch.Tensor:
    # [num_slots, Hkv, D] -> [num_slots // block_size, block_size, Hkv, D]: the same memory
    return cache.view(cache.shape[0] // block_size, block_size, *cache.shape[1:])


def _call(q, k_cache, v_cache, block_table, cache_seqlens, *, block_size, scale, sliding_window, num_splits):
    from flash_attn import flash_attn_with_kvcache  # imported at call time: is_available() said it imports

    out = flash_attn_with_kvcache(
        q.unsqueeze(1),  # (batch, seqlen_q = 1, nheads, headdim)
        _paged(k_cache, block_size),
        _paged(v_cache, block_size),
        cache_seqlens=cache_seqlens.to(torch.int32).contiguous(),
        block_table=block_table.to(torch.int32).contiguous(),
        softmax_scale=scale,
        causal=True,
        window_size=_window_size(sliding_window),
        num_splits=num_splits,
    )
    return out.squeeze(1)


def decode_attention(
    q: torch.Tensor,  # [B, Hq, D]: one query row per sequence, at position context_lens[b] - 1
    k_cache: torch.Tensor,  # [num_slots, Hkv, D]
    v_cache: torch.Tensor,  # [num_slots, Hkv, D]
    block_tables: torch.Tensor,  # [B, max_blocks] (any int dtype; passed as int32)
    context_lens: torch.Tensor,  # [B], >= 1
    *,
    block_size: int,
    scale: float,
    sliding_window: int | None = None,
    num_splits: int = 0,
) -> torch.Tensor:
    """Fast-path decode attention through flash-attn (``num_splits=0``: its heuristic); returns [B, Hq, D]."""
    return _call(q, k_cache, v_cache, block_tables, context_lens, block_size=block_size, scale=scale,
                 sliding_window=sliding_window, num_splits=num_splits)


def canonical_attention(
    q: torch.Tensor,  # [N, Hq, D]
    k_cache: torch.Tensor,  # [num_slots, Hkv, D]
    v_cache: torch.Tensor,  # [num_slots, Hkv, D]
    positions: torch.Tensor,  # [N]: each row's absolute position; it sees keys [0, position]
    row_seq: torch.Tensor,  # [N]: the block-table row of each query row
    block_tables: torch.Tensor,  # [S, max_blocks]
    *,
    block_size: int,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Canonical attention through flash-attn: every row its own batch element, ``num_splits=1``; returns [N, Hq, D].

    The row-wise block table is gathered by ``row_seq`` (a fixed-shape gather),
    so the launch has batch = N whatever the rows hold.
    """
    return _call(q, k_cache, v_cache, block_tables[row_seq], positions + 1, block_size=block_size, scale=scale,
                 sliding_window=sliding_window, num_splits=1)
