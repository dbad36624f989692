"""``FixedShapePolicy(gemm_rows=N)``: every canonical GEMM on blocks of exactly N rows, the same bits at any pass width.

On CUDA the library GEMM gives a row bits that depend on M (cuBLAS picks its kernel by shape) but not on where the
row sits among M rows (observation O2). The default canonical config runs every GEMM at M = R (R-row blocks of a wide
pass); ``gemm_rows=N`` runs them at M = N instead: a linear of n rows as blocks of N rows, the last padded with zero
rows (``fixed_row_blocks``). On the CPU the canonical GEMM is exact, so these tests run the policy's CUDA path on the
CPU with a stand-in library GEMM whose rows move with M (x (1 + M * 2^-8)), and check that narrow and wide passes,
wide verify passes and passes beside free requests commit the same tokens, log-probs, top alternatives and prompt
K/V; negative control: the same blocks without the padding (each GEMM at its block's own M) commit other bits.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llm42 import DVRGenerator, SamplingParams
from llm42.model.weights import random_weights
from llm42.ops import exact
from llm42.policies import FixedShapePolicy
from llm42.policies import fixed_shape
from llm42.policies.fixed_shape import fixed_row_blocks, position_variant_gemms
from llm42.verify.pass_shapes import GemmRowBlocks, bucket_gemm_rows, pass_buckets
from tests.helpers import count_windows, prompt_kv, run_beside_free, tiny_config

CFG = tiny_config(max_position_embeddings=256)
WEIGHTS = random_weights(CFG, seed=11)
WINDOW, GROUP = 4, 2  # R = 8
R = WINDOW * GROUP
N = 2 * R  # the fixed GEMM M under test
PROMPTS = [[(7 * i + 3 * j) % (CFG.vocab_size - 3) + 3 for j in range(n)] for i, n in enumerate((61, 5, 23, 40))]
SHORT_PROMPTS = [[(5 * i + 7 * j) % (CFG.vocab_size - 3) + 3 for j in range(3 + i % 4)] for i in range(12)]


def _scaled_by_m(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """A library GEMM whose rows depend on M, not on a row's position: the exact GEMM x (1 + M * 2^-8)."""
    return exact.linear(x, weight, bias, slices=exact.SHARED_WEIGHT_SLICES) * (1 + x.shape[0] * 2.0 ** -8)


class _LibraryByM(FixedShapePolicy):
    """``FixedShapePolicy``'s CUDA GEMM path on the CPU (``_cuda_linear``: ``gemm_rows`` blocks or one call), over
    a stand-in library GEMM whose rows move with M; it records the M of every library call."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.rows_seen: list[int] = []

    def linear(self, x, weight, bias=None):
        return self._cuda_linear(x, weight, bias)

    def _is_library_device(self, device):
        return True  # the premise check runs here too (``check_gemm_rows``)

    def _library_linear(self, x, weight, bias, *, out=None):
        self.rows_seen.append(x.shape[0])
        result = _scaled_by_m(x, weight, bias)
        return result if out is None else out.copy_(result)


def _generator(policy, max_canonical_tokens: int, **kwargs) -> DVRGenerator:
    return DVRGenerator(WEIGHTS, CFG, window=WINDOW, group=GROUP, kv_cache_tokens=1024, block_size=8,
                        max_fast_tokens=64, max_canonical_tokens=max_canonical_tokens, canonical_policy=policy,
                        **kwargs)


def _params(i: int, **overrides) -> SamplingParams:
    base = dict(max_new_tokens=10, deterministic=True, ignore_eos=True, seed=100 + i, logprobs=3)
    if i % 2:
        base.update(temperature=0.9, top_k=20)
    return SamplingParams(**{**base, **overrides})


def _outputs(gen: DVRGenerator, prompts=PROMPTS, *, num_free: int = 0, **overrides):
    free = [list(range(3, 3 + 20 + 5 * i)) for i in range(num_free)]
    return run_beside_free(gen, prompts, [_params(i, **overrides) for i in range(len(prompts))], free,
                           SamplingParams(max_new_tokens=12, ignore_eos=True))


def test_bad_gemm_rows_is_refused_naming_the_field():
    for bad in (0, -256):
        with pytest.raises(ValueError, match="gemm_rows must be a positive integer"):
            FixedShapePolicy(gemm_rows=bad)
    for bad in (True, "1024", 512.0):
        with pytest.raises(TypeError, match="gemm_rows must be an int"):
            FixedShapePolicy(gemm_rows=bad)
    with pytest.raises(ValueError, match="gemm_rows .*gemm='triton'"):
        FixedShapePolicy(gemm="triton", gemm_rows=1024)
    policy = FixedShapePolicy(gemm_rows=1024)
    assert repr(policy) == "FixedShapePolicy(key_block=64, gemm_rows=1024)"
    assert policy.is_gemm_row_invariant and not FixedShapePolicy().is_gemm_row_invariant
    assert FixedShapePolicy().gemm_rows is None


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 70), rows=st.integers(1, 20), seed=st.integers(0, 2 ** 16))
def test_fixed_row_blocks_hand_every_call_exactly_rows_rows(n, rows, seed):
    """Every call sees ``rows`` rows; each output row is the map's at M = ``rows`` of that row alone, whatever n is
    and wherever the row sits. Negative control: the map at M = n gives other values wherever n differs from rows."""
    x = torch.randn(n, 6, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    seen = []

    def by_m(block, out):
        seen.append(block.shape[0])
        return out.copy_(block * (1 + block.shape[0] * 2.0 ** -8))

    out = fixed_row_blocks(x, rows, 6, by_m)
    assert out.shape == x.shape and set(seen) == {rows}
    assert torch.equal(out, x * (1 + rows * 2.0 ** -8))
    row = seed % n
    assert torch.equal(fixed_row_blocks(x[row: row + 1], rows, 6, by_m), out[row: row + 1])
    assert torch.equal(by_m(x, torch.empty_like(x)), out) == (n == rows)


def test_pass_buckets_of_a_block_or_more_are_whole_gemm_blocks():
    assert pass_buckets(256, 2048) == (256, 512, 1024, 2048)
    # a narrower bucket stays (its GEMMs pad their one block, its row ops run on its own rows)
    assert pass_buckets(256, 2048, gemm_rows=1024) == (256, 512, 1024, 2048)
    assert pass_buckets(256, 3072, gemm_rows=1024) == (256, 512, 1024, 2048, 3072)
    assert pass_buckets(256, 2048, gemm_rows=2048) == (256, 512, 1024, 2048)
    assert pass_buckets(256, 512, gemm_rows=1024) == (256, 512)  # a block wider than any pass: every pass pads it
    assert pass_buckets(8, 40, is_graphed=False, gemm_rows=16) == (8, 16, 32, 40)  # 24 -> 32, 40 stays the cap
    assert pass_buckets(8, 48, is_graphed=False, gemm_rows=16) == (8, 16, 32, 48)
    # CUDA only, and only a multiple of R (the buckets stay multiples of R)
    assert bucket_gemm_rows(FixedShapePolicy(gemm_rows=1024), torch.device("cuda"), 256) == 1024
    assert bucket_gemm_rows(FixedShapePolicy(gemm_rows=1000), torch.device("cuda"), 256) is None
    assert bucket_gemm_rows(FixedShapePolicy(gemm_rows=1024), torch.device("cpu"), 256) is None
    assert bucket_gemm_rows(FixedShapePolicy(), torch.device("cuda"), 256) is None
    assert _generator(FixedShapePolicy(gemm_rows=N), 8 * R).verifier.canonical_pass.buckets == tuple(
        range(R, 8 * R + 1, R))  # the CPU: every multiple of R, as without


def test_on_the_cpu_gemm_rows_commits_the_default_configs_bits():
    """The CPU's canonical GEMM is exact: a row's bits are its own at any M, so ``gemm_rows`` changes none."""
    assert _outputs(_generator(FixedShapePolicy(gemm_rows=N), 4 * R)) == _outputs(_generator(FixedShapePolicy(), R))


def test_passes_of_any_width_commit_the_same_bits_with_fixed_gemm_rows():
    """Narrow passes (R rows: each GEMM block padded from R to N rows), wide passes of prompt chunks (up to 8R rows),
    wide verify passes (more than G windows) and passes beside free requests: the same tokens, log-probs, top
    alternatives and prompt K/V, every library GEMM at M = N."""
    narrow_policy = _LibraryByM(gemm_rows=N)
    narrow = _generator(narrow_policy, R)
    reference = _outputs(narrow)
    assert set(narrow_policy.rows_seen) == {N}
    wide_policy = _LibraryByM(gemm_rows=N)
    wide = _generator(wide_policy, 8 * R)
    assert _outputs(wide) == reference
    assert set(wide_policy.rows_seen) == {N}
    assert wide.stats["canonical_rows"] > R * wide.stats["canonical_passes"] - R, "no pass wider than R ran"
    for prompt in PROMPTS:
        if len(prompt) > R:
            for a, b in zip(prompt_kv(wide, prompt), prompt_kv(narrow, prompt)):
                assert torch.equal(a, b)
    assert _outputs(_generator(_LibraryByM(gemm_rows=N), 8 * R), num_free=3) == reference

    short = _outputs(_generator(_LibraryByM(gemm_rows=N), R), SHORT_PROMPTS, max_new_tokens=20)
    verify = _generator(_LibraryByM(gemm_rows=N), 8 * R, wide_verify=True)
    windows = count_windows(verify)
    assert _outputs(verify, SHORT_PROMPTS, max_new_tokens=20) == short
    assert max(windows) > GROUP, f"no pass held more than G windows: {windows}"


def test_negative_control_blocks_without_padding_or_another_m_commit_other_bits(monkeypatch):
    """Without the padding (a short block's GEMM at its own M) narrow and wide passes disagree, so the equality above
    can see a GEMM at the wrong M; and M = N is another canonical config than M = R (``gemm_rows=None``: R-row
    blocks), whose passes agree among themselves."""
    reference = _outputs(_generator(_LibraryByM(gemm_rows=N), R))
    at_r = _outputs(_generator(_LibraryByM(), R))
    assert _outputs(_generator(_LibraryByM(), 8 * R)) == at_r  # GemmRowBlocks: every GEMM at M = R
    assert at_r != reference

    def unpadded(x, rows, num_out, gemm):
        out = x.new_empty(x.shape[0], num_out)
        for i in range(0, x.shape[0], rows):
            gemm(x[i: i + rows], out[i: i + rows])
        return out

    monkeypatch.setattr(fixed_shape, "fixed_row_blocks", unpadded)
    assert _outputs(_generator(_LibraryByM(gemm_rows=N), 8 * R)) != _outputs(_generator(_LibraryByM(gemm_rows=N), R))


def test_a_fixed_m_policy_is_used_as_is_for_every_bucket():
    """``is_gemm_row_invariant``: no R-row blocks around a ``gemm_rows`` policy (its own blocks are N rows)."""
    gen = _generator(FixedShapePolicy(gemm_rows=N), 8 * R)
    cp = gen.verifier.canonical_pass
    gen.generate([PROMPTS[0]], [_params(0, max_new_tokens=2)])
    assert cp.is_row_invariant
    assert not any(isinstance(p, GemmRowBlocks) for p in cp._policies.values())


class _PositionByM(_LibraryByM):
    """A stand-in library GEMM whose rows also move with their position among M rows (O2 failing): + i * 2^-12."""

    def _library_linear(self, x, weight, bias, *, out=None):
        result = _scaled_by_m(x, weight, bias) + torch.arange(x.shape[0], dtype=x.dtype)[:, None] * 2.0 ** -12
        return result if out is None else out.copy_(result)


def test_the_premise_is_checked_on_the_device_when_a_pass_is_built():
    """``check_gemm_rows``: with a library GEMM whose rows keep their bits at any position among N rows the engine
    builds; with one whose rows move with their position it refuses, naming ``gemm_rows`` and every GEMM shape."""
    assert position_variant_gemms(_scaled_by_m, WEIGHTS.linears(), N) == []
    moved = position_variant_gemms(_PositionByM(gemm_rows=N)._library_linear, WEIGHTS.linears(), N)
    assert [m.split()[0] for m in moved] == ["qkv", "o_proj", "gate_up", "down", "lm_head"]
    honest = _LibraryByM(gemm_rows=N)
    _generator(honest, 4 * R)
    assert honest.rows_seen and set(honest.rows_seen) == {N}  # the check ran, at M = N
    with pytest.raises(RuntimeError, match=f"gemm_rows={N}: .*qkv .*lm_head .*O2"):
        _generator(_PositionByM(gemm_rows=N), 4 * R)
    # without gemm_rows, or on the CPU's exact GEMM, there is nothing to check
    _generator(_PositionByM(), 4 * R)
    FixedShapePolicy(gemm_rows=N).check_gemm_rows(WEIGHTS)
