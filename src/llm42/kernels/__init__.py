"""Triton kernels for the GPU: paged attention (fast split-KV decode, tiled prefill, tiled canonical, chunked
canonical, the canonical row kernel) and RMSNorm.

Importing this package needs Triton (shipped with CUDA builds of torch). The
policies import it only when they see CUDA tensors, so CPU-only installs never do.
"""

from llm42.kernels.attention import (
    MAX_SPLITS,
    canonical_attention,
    choose_num_splits,
    num_sms,
    paged_decode_attention,
)
from llm42.kernels.chunked_attention import chunked_canonical_attention, chunked_canonical_decode_attention
from llm42.kernels.norm import rms_norm
from llm42.kernels.tiled_attention import (
    tiled_canonical_attention,
    tiled_canonical_decode_attention,
    tiled_prefill_attention,
)

__all__ = [
    "MAX_SPLITS", "canonical_attention", "chunked_canonical_attention", "chunked_canonical_decode_attention", "choose_num_splits", "num_sms", "paged_decode_attention", "rms_norm",
    "tiled_canonical_attention", "tiled_canonical_decode_attention", "tiled_prefill_attention",
]
