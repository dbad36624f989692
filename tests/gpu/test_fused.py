"""The fused row-wise kernels (``llm42.kernels.fused``) and the policies' row ops.

Each kernel is checked on fresh random inputs against a float64 reference and
against the unfused torch composition the model ran before (``TorchRowOps``
around the policy's RMSNorm): the elementwise parts (residual sums, RoPE
without q/k norm, the V copy) must be the same bits, the parts with a float32
reduction or an exponential must agree within rounding. Outputs are poisoned
(NaN) first, so an element the kernel never wrote shows. A row's result must
not depend on the other rows or on where it sits. The last test runs without a
GPU: a policy with only the five ``ReductionPolicy`` members still works, and
computes exactly what the built-in policies compute on the CPU.
"""

from __future__ import annotations

import pytest
import torch

from llm42.kv_store import KVStore
from llm42.model.forward import forward
from llm42.model.weights import random_weights
from llm42.params import SamplingParams
from llm42.policies import FastPolicy, FixedShapePolicy
from llm42.policies.base import TorchRowOps, row_ops
from llm42.runner import ModelRunner, Segment
from tests.helpers import tiny_config

DEVICE = "cuda"
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 1e-4}
EPS = 1e-5


@pytest.fixture(scope="module")
def fused():
    return pytest.importorskip("llm42.kernels.fused")


class ProtocolOnly:
    """A user policy with just the five ``ReductionPolicy`` members, delegating to ``inner``."""

    def __init__(self, inner):
        self.inner = inner
        self.name = "protocol_only"
        self.is_shape_closed = inner.is_shape_closed

    def linear(self, x, weight, bias=None):
        return self.inner.linear(x, weight, bias)

    def rms_norm(self, x, weight, eps):
        return self.inner.rms_norm(x, weight, eps)

    def attention(self, q, k_cache, v_cache, inputs, *, block_size, scale, sliding_window):
        return self.inner.attention(q, k_cache, v_cache, inputs, block_size=block_size, scale=scale,
                                    sliding_window=sliding_window)

    def process_logits(self, logits, inputs):
        return self.inner.process_logits(logits, inputs)


def unfused_ops():
    """The row ops as the model computed them before fusion: torch ops around FastPolicy's RMSNorm."""
    return row_ops(ProtocolOnly(FastPolicy()))


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out64 = out.double().cpu()
    if not torch.isfinite(out64).all():
        return float("inf")
    return float((out64 - ref).norm() / ref.norm())


def poison_allocator(shapes, dtype) -> None:
    """Free NaN-filled blocks of these shapes, so outputs allocated next show any element left unwritten."""
    held = [torch.full(shape, float("nan"), dtype=dtype, device=DEVICE) for shape in shapes]
    del held


def randn(gen, *shape, dtype, scale=1.0):
    return (torch.randn(*shape, generator=gen) * scale).to(device=DEVICE, dtype=dtype)


def rope_rows(positions: torch.Tensor, head_dim: int, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [N, D] of the rotate-half layout at ``positions``, in ``dtype`` (as forward gathers them)."""
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(device=DEVICE, dtype=dtype), emb.sin().to(device=DEVICE, dtype=dtype)


def reference_rope(x64, cos64, sin64, norm64=None, eps=EPS):
    # x64: [N, H, D] float64; the float64 RoPE (after the per-head RMSNorm) of the same inputs
    if norm64 is not None:
        x64 = norm64 * x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    half = x64.shape[-1] // 2
    rotated = torch.cat((-x64[..., half:], x64[..., :half]), dim=-1)
    return x64 * cos64[:, None, :] + rotated * sin64[:, None, :]


@pytest.mark.gpu
@pytest.mark.parametrize("rows,hidden", [(1, 4096), (37, 4096), (300, 5120), (64, 128), (5, 96)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_matches_float64_and_the_unfused_ops(fused, rows, hidden, dtype):
    gen = torch.Generator().manual_seed(rows * hidden)
    x = randn(gen, rows, hidden, dtype=dtype)
    residual = randn(gen, rows, hidden, dtype=dtype, scale=3.0)
    weight = (1 + 0.1 * torch.randn(hidden, generator=gen)).to(device=DEVICE, dtype=dtype)
    x_before, residual_before = x.clone(), residual.clone()
    poison_allocator([(rows, hidden)] * 2, dtype)
    out, new_residual = fused.add_rms_norm(x, residual, weight, EPS)
    assert out.shape == new_residual.shape == x.shape and out.dtype == new_residual.dtype == dtype
    assert torch.equal(x, x_before) and torch.equal(residual, residual_before)
    assert torch.equal(new_residual, residual + x)  # the residual stream: same bits as torch's add
    s64 = new_residual.double().cpu()
    ref = weight.double().cpu() * s64 * torch.rsqrt(s64.pow(2).mean(-1, keepdim=True) + EPS)
    assert relative_error(out, ref) < TOLERANCE[dtype]
    unfused_out, unfused_residual = unfused_ops().add_rms_norm(x, residual, weight, EPS)
    assert torch.equal(new_residual, unfused_residual)
    assert relative_error(out, unfused_out.double().cpu()) < TOLERANCE[dtype]


ROPE_SHAPES = [
    # (num_rows, num_heads, num_kv_heads, head_dim, has_norm)
    (1, 32, 8, 128, False),
    (37, 32, 8, 128, True),
    (300, 12, 4, 96, False),
    (64, 16, 16, 64, True),
    (5, 8, 2, 256, True),
]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", ROPE_SHAPES, ids=lambda s: "x".join(str(v) for v in s))
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_and_store_matches_float64_and_the_unfused_ops(fused, shape, dtype):
    num_rows, num_heads, num_kv_heads, head_dim, has_norm = shape
    gen = torch.Generator().manual_seed(sum(shape))
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    qkv = randn(gen, num_rows, q_size + 2 * kv_size, dtype=dtype, scale=2.0)  # as the qkv GEMM leaves it
    q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    q = q.reshape(num_rows, num_heads, head_dim)
    k = k.reshape(num_rows, num_kv_heads, head_dim)
    v = v.reshape(num_rows, num_kv_heads, head_dim)
    positions = torch.randint(0, 8192, (num_rows,), generator=gen)
    cos, sin = rope_rows(positions, head_dim, dtype)
    norms = {}
    if has_norm:
        norms = {name: (1 + 0.2 * torch.randn(head_dim, generator=gen)).to(device=DEVICE, dtype=dtype)
                 for name in ("q_norm", "k_norm")}
    num_slots = 3 * num_rows + 7
    slots = torch.randperm(num_slots, generator=gen)[:num_rows].to(DEVICE)
    caches = [torch.full((num_slots, num_kv_heads, head_dim), float("nan"), dtype=dtype, device=DEVICE)
              for _ in range(4)]
    poison_allocator([(num_rows, num_heads, head_dim)], dtype)
    q_out = fused.rope_and_store(q, k, v, cos, sin, caches[0], caches[1], slots, eps=EPS, **norms)
    assert q_out.shape == q.shape and q_out.dtype == dtype

    unwritten = torch.ones(num_slots, dtype=torch.bool, device=DEVICE)
    unwritten[slots] = False
    for cache in caches[:2]:
        assert torch.isnan(cache[unwritten]).all() and not torch.isnan(cache[slots]).any()
    assert torch.equal(caches[1][slots], v)

    cos64, sin64 = cos.double().cpu(), sin.double().cpu()
    norm64 = {name: w.double().cpu() for name, w in norms.items()}
    ref_q = reference_rope(q.double().cpu(), cos64, sin64, norm64.get("q_norm"))
    ref_k = reference_rope(k.double().cpu(), cos64, sin64, norm64.get("k_norm"))
    assert relative_error(q_out, ref_q) < TOLERANCE[dtype]
    assert relative_error(caches[0][slots], ref_k) < TOLERANCE[dtype]

    unfused_q = unfused_ops().rope_and_store(q, k, v, cos, sin, caches[2], caches[3], slots, eps=EPS, **norms)
    assert torch.equal(caches[3][slots], caches[1][slots])
    if has_norm:  # the per-head RMSNorm's float32 sum: within rounding of the unfused kernel
        assert relative_error(q_out, unfused_q.double().cpu()) < TOLERANCE[dtype]
        assert relative_error(caches[0][slots], caches[2][slots].double().cpu()) < TOLERANCE[dtype]
    else:  # elementwise only: the products and sums rounded exactly where torch rounds them
        assert torch.equal(q_out, unfused_q)
        assert torch.equal(caches[0][slots], caches[2][slots])


@pytest.mark.gpu
@pytest.mark.parametrize("rows,inter", [(1, 14336), (37, 14336), (300, 1000), (64, 100)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_matches_float64_and_the_unfused_ops(fused, rows, inter, dtype):
    gen = torch.Generator().manual_seed(rows + inter)
    gate_up = randn(gen, rows, 2 * inter, dtype=dtype, scale=3.0)
    poison_allocator([(rows, inter)], dtype)
    out = fused.swiglu(gate_up)
    assert out.shape == (rows, inter) and out.dtype == dtype
    g64, u64 = gate_up.double().cpu().chunk(2, dim=-1)
    assert relative_error(out, torch.nn.functional.silu(g64) * u64) < TOLERANCE[dtype]
    assert relative_error(out, unfused_ops().swiglu(gate_up).double().cpu()) < TOLERANCE[dtype]


@pytest.mark.gpu
def test_fused_rows_do_not_depend_on_the_batch_or_placement(fused, dtype=torch.bfloat16):
    """A probe row gets the same bits from each kernel in batches of 1..256 rows, at any index."""
    gen = torch.Generator().manual_seed(42)
    hidden, inter, num_heads, num_kv_heads, head_dim = 4096, 14336, 32, 8, 128
    qkv_width = (num_heads + 2 * num_kv_heads) * head_dim
    probe_x, probe_res = randn(gen, hidden, dtype=dtype), randn(gen, hidden, dtype=dtype, scale=3.0)
    probe_gate_up, probe_qkv = randn(gen, 2 * inter, dtype=dtype, scale=3.0), randn(gen, qkv_width, dtype=dtype)
    weight = (1 + 0.1 * torch.randn(hidden, generator=gen)).to(device=DEVICE, dtype=dtype)
    norms = {name: (1 + 0.2 * torch.randn(head_dim, generator=gen)).to(device=DEVICE, dtype=dtype)
             for name in ("q_norm", "k_norm")}
    probe_pos, probe_slot = 1234, 5
    outputs = []
    for num_rows in (1, 7, 64, 256):
        for index in sorted({0, num_rows // 2, num_rows - 1}):
            x, res = randn(gen, num_rows, hidden, dtype=dtype), randn(gen, num_rows, hidden, dtype=dtype)
            gate_up, qkv = randn(gen, num_rows, 2 * inter, dtype=dtype), randn(gen, num_rows, qkv_width, dtype=dtype)
            positions = torch.randint(0, 4096, (num_rows,), generator=gen)
            slots = torch.randperm(300, generator=gen)[:num_rows] + 10  # slots 10.. for the others
            x[index], res[index], gate_up[index], qkv[index] = probe_x, probe_res, probe_gate_up, probe_qkv
            positions[index], slots[index] = probe_pos, probe_slot
            out, new_res = fused.add_rms_norm(x, res, weight, EPS)
            q, k, v = qkv.split([num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1)
            k_cache = torch.zeros(320, num_kv_heads, head_dim, dtype=dtype, device=DEVICE)
            v_cache = torch.zeros_like(k_cache)
            cos, sin = rope_rows(positions, head_dim, dtype)
            q_out = fused.rope_and_store(
                q.reshape(num_rows, num_heads, head_dim), k.reshape(num_rows, num_kv_heads, head_dim),
                v.reshape(num_rows, num_kv_heads, head_dim), cos, sin, k_cache, v_cache, slots.to(DEVICE),
                eps=EPS, **norms,
            )
            outputs.append((out[index], new_res[index], fused.swiglu(gate_up)[index], q_out[index],
                            k_cache[probe_slot], v_cache[probe_slot]))
    first = outputs[0]
    for other in outputs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(first, other))


MODEL_CONFIGS = {
    "llama": dict(hidden_size=256, intermediate_size=512, num_heads=8, num_kv_heads=2, head_dim=32),
    "qwen3_qk_norm_bias": dict(family="qwen3", qk_norm=True, attention_bias=True, o_proj_bias=True,
                               hidden_size=256, intermediate_size=384, num_heads=4, num_kv_heads=2, head_dim=64),
    "mistral_window_mlp_bias": dict(family="mistral", sliding_window=9, mlp_bias=True, hidden_size=192,
                                    intermediate_size=320, num_heads=6, num_kv_heads=3, head_dim=32),
}


def _model_passes(cfg, weights, policy, dtype, device):
    """Logits of a varlen prefill step, a decode step and a 32-row canonical pass, and the K/V written."""
    kv = KVStore(cfg, num_blocks=64, block_size=16, num_scratch_slots=64, dtype=dtype, device=device)
    runner = ModelRunner(weights, cfg)
    params = SamplingParams()
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, cfg.vocab_size, (n,), generator=gen).tolist() for n in (19, 6, 33)]
    for rid, prompt in enumerate(prompts):
        kv.allocate(rid, 64)
        kv.append(rid, len(prompt) + 4)
    prefill = [Segment(rid, tuple(p), 0, params, 0) for rid, p in enumerate(prompts)]
    decode = [Segment(rid, (5 + rid,), len(p), params, 0) for rid, p in enumerate(prompts)]
    window = [Segment(rid, (9, 10, 11), len(p) + 1, params, 0) for rid, p in enumerate(prompts)]
    logits = [
        forward(weights, cfg, runner.fast_inputs(prefill, kv), kv.layers(), policy),
        forward(weights, cfg, runner.fast_inputs(decode, kv), kv.layers(), policy),
        forward(weights, cfg, runner.canonical_inputs(window, kv, 32), kv.layers(), policy),
    ]
    slots = torch.tensor([s for rid, p in enumerate(prompts) for s in kv.slots(rid, 0, len(p) + 4)], device=device)
    written = [kv.layers().k[i][slots] for i in range(cfg.num_layers)]
    written += [kv.layers().v[i][slots] for i in range(cfg.num_layers)]
    return logits, written


@pytest.mark.gpu
@pytest.mark.parametrize("config", sorted(MODEL_CONFIGS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("make_policy", [FastPolicy, lambda: FixedShapePolicy(key_block=16)],
                         ids=["fast", "fixed_shape"])
def test_forward_with_fused_row_ops_matches_the_unfused_forward(fused, config, dtype, make_policy):
    cfg = tiny_config(vocab_size=512, **MODEL_CONFIGS[config])
    weights = random_weights(cfg, seed=3, dtype=dtype, device=DEVICE, std=0.05)
    policy = make_policy()
    fused_logits, fused_kv = _model_passes(cfg, weights, policy, dtype, DEVICE)
    unfused_logits, unfused_kv = _model_passes(cfg, weights, ProtocolOnly(policy), dtype, DEVICE)
    # rounding differences of the RMSNorm sums compound through the layers; bf16 keeps 8 bits
    tolerance = {torch.bfloat16: 5e-2, torch.float32: 1e-4}[dtype]
    for a, b in zip(fused_logits + fused_kv, unfused_logits + unfused_kv):
        assert relative_error(a, b.double().cpu()) < tolerance


def test_policy_with_only_the_protocol_members_computes_the_built_in_bits():
    """On the CPU, forward through the row-ops fallback equals forward through FastPolicy's own row ops."""
    cfg = tiny_config(family="qwen3", qk_norm=True, attention_bias=True, o_proj_bias=True, sliding_window=11)
    weights = random_weights(cfg, seed=4, std=0.1)
    for policy in (FastPolicy(), FixedShapePolicy(key_block=4)):
        built_in, _ = _model_passes(cfg, weights, policy, torch.float32, "cpu")
        fallback, _ = _model_passes(cfg, weights, ProtocolOnly(policy), torch.float32, "cpu")
        assert all(torch.equal(a, b) for a, b in zip(built_in, fallback))


def test_row_ops_uses_the_members_a_policy_has():
    calls = []

    class OwnSwiglu(ProtocolOnly):
        def swiglu(self, gate_up):
            calls.append(gate_up.shape)
            return TorchRowOps.swiglu(self, gate_up)

    policy = OwnSwiglu(FastPolicy())
    ops = row_ops(policy)
    assert row_ops(FastPolicy()).__class__ is FastPolicy
    out = ops.swiglu(torch.randn(3, 8))
    assert calls == [(3, 8)] and out.shape == (3, 4)
    x, res, w = torch.randn(2, 8), torch.randn(2, 8), torch.rand(8)
    normed, new_res = ops.add_rms_norm(x, res, w, EPS)
    assert torch.equal(new_res, res + x) and torch.equal(normed, FastPolicy().rms_norm(res + x, w, EPS))
