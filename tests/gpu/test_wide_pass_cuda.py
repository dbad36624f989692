"""Wide canonical passes on CUDA: the same committed bits as R-row passes, with cuBLAS GEMMs (and the Triton GEMM).

On the CPU every canonical GEMM is exact, so a wide pass agrees with narrow passes whatever
its GEMMs' shapes (tests/test_wide_pass.py checks the staging, the selected rows and the
R-row blocks). Here the GEMMs are cuBLAS's, whose rows depend on M: the wide pass must run
them on R-row blocks for its rows to get the bits R-row passes give them. Llama-3.1-8B
shape (``LLM42_GPU_TEST_LAYERS`` deep), bf16, CUDA graphs on, R = 256, passes of up to
1,024 rows: deterministic prompts of 1,500 and 700 tokens (one greedy, one sampled, with
top alternatives), alone and next to free requests; the prompts' canonical K/V compared bit
for bit. Control: a different canonical config (key blocks of 32 keys) changes the K/V, so
the comparison can see a difference.
"""

from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("triton")

from llm42 import SamplingParams  # noqa: E402
from llm42.verify import canonical_pass, pass_shapes  # noqa: E402
from llm42.policies import FixedShapePolicy  # noqa: E402
from tests.helpers import (WIDE_GROUP, WIDE_WINDOW, count_windows, prompt_kv, run_beside_random_free,  # noqa: E402
                           wide_pass_generator, wide_pass_requests)

pytestmark = pytest.mark.gpu

WINDOW, GROUP = WIDE_WINDOW, WIDE_GROUP










def test_wide_passes_commit_the_bits_of_r_row_passes_on_cuda(llama8b, report):
    cfg, _ = llama8b
    prompts, params = wide_pass_requests(cfg.vocab_size)
    narrow = wide_pass_generator(llama8b, WINDOW * GROUP)
    reference = run_beside_random_free(narrow, prompts, params)
    reference_kv = prompt_kv(narrow, prompts[0], min_tokens=1025)
    narrow.close()

    wide = wide_pass_generator(llama8b, 4 * WINDOW * GROUP)
    alone = run_beside_random_free(wide, prompts, params)
    assert wide.stats["canonical_rows"] > 256 * wide.stats["canonical_passes"] - 256, "no wide pass ran"
    wide_kv = prompt_kv(wide, prompts[0], min_tokens=1025)
    batched = run_beside_random_free(wide_pass_generator(llama8b, 4 * WINDOW * GROUP), prompts, params, num_free=24)
    wide.close()
    report("wide_pass_kv_equal", bool(torch.equal(wide_kv, reference_kv)))
    assert torch.equal(wide_kv, reference_kv)
    assert alone == reference
    assert batched == reference

    # control: another canonical config's K/V differs, so the equality above is not vacuous
    other = wide_pass_generator(llama8b, 4 * WINDOW * GROUP, canonical_policy=FixedShapePolicy(key_block=32))
    run_beside_random_free(other, prompts[:1], params[:1])
    other_kv = prompt_kv(other, prompts[0], min_tokens=1025)
    other.close()
    report("key_block_32_kv_entries_differing", int((other_kv != reference_kv).sum()))
    assert not torch.equal(other_kv, reference_kv)


def test_wide_verify_passes_commit_the_bits_of_r_row_passes_on_cuda(llama8b, report):
    """Forty deterministic requests decoding at once, ``wide_verify=True``: their windows fill passes of up to
    1,024 rows (more than G windows each), whose head and sampler run on blocks of R result rows; the bits are an R-row pass's."""
    cfg, _ = llama8b
    rng = random.Random(11)
    prompts = [[rng.randrange(3, cfg.vocab_size) for _ in range(rng.randint(8, 40))] for _ in range(40)]
    params = [SamplingParams(max_new_tokens=48, deterministic=True, ignore_eos=True, logprobs=True,
                             temperature=0.0 if i % 2 else 0.8, seed=100 + i) for i in range(40)]
    narrow = wide_pass_generator(llama8b, WINDOW * GROUP)
    reference = run_beside_random_free(narrow, prompts, params)
    narrow.close()
    wide = wide_pass_generator(llama8b, 4 * WINDOW * GROUP, wide_verify=True)
    windows = count_windows(wide)
    got = run_beside_random_free(wide, prompts, params, num_free=16)
    wide.close()
    report("wide_verify_max_windows_per_pass", max(windows))
    assert max(windows) > GROUP, f"no pass held more than G windows: {windows}"
    assert got == reference


@pytest.mark.parametrize("gemm_streams", [4, 1])
def test_gemm_block_streams_and_tile_tables_keep_the_bits_on_cuda(llama8b, monkeypatch, gemm_streams, report):
    """Wide verify passes with their R-row GEMM blocks side by side on ``gemm_streams`` streams and the tiled
    attention's tile tables (round 15) commit exactly the bits of R-row passes without tile tables (round 14's
    launch): windows cut short by ``max_new_tokens`` and prompt chunks of odd lengths put runs at offsets the
    fixed tiling straddles."""
    cfg, _ = llama8b
    rng = random.Random(13)
    prompts = [[rng.randrange(3, cfg.vocab_size) for _ in range(rng.randint(5, 300))] for _ in range(36)]
    params = [SamplingParams(max_new_tokens=rng.randint(9, 70), deterministic=True, ignore_eos=True, logprobs=True,
                             temperature=0.0 if i % 2 else 0.8, seed=200 + i) for i in range(36)]
    monkeypatch.setattr(canonical_pass, "SEGMENT_TILES", False)
    narrow = wide_pass_generator(llama8b, WINDOW * GROUP)
    reference = run_beside_random_free(narrow, prompts, params)
    assert narrow.verifier.canonical_pass._rows.tiles is None  # bound (and staged) at its first pass
    narrow.close()
    monkeypatch.setattr(canonical_pass, "SEGMENT_TILES", True)
    wide = wide_pass_generator(llama8b, 4 * WINDOW * GROUP, wide_verify=True, canonical_gemm_streams=gemm_streams)
    assert len(wide.verifier.canonical_pass._block_streams) == (gemm_streams if gemm_streams > 1 else 0)
    windows = count_windows(wide)
    got = run_beside_random_free(wide, prompts, params, num_free=12)
    assert wide.verifier.canonical_pass._rows.tiles is not None
    wide.close()
    report(f"gemm_streams_{gemm_streams}_max_windows_per_pass", max(windows))
    assert max(windows) > GROUP, f"no pass held more than G windows: {windows}"
    assert got == reference


def test_the_triton_canonical_gemm_gives_a_row_its_bits_at_any_number_of_rows():
    """``FixedShapePolicy(gemm="triton")``'s linear at the 8B shape's widths: rows of a 2,048-row call equal the same
    rows run alone, in R-row blocks and shuffled among other rows. Control: cuBLAS at M = 2,048 vs M = 1 differs
    somewhere in these shapes (so the comparison can see a difference where it exists)."""
    policy = FixedShapePolicy(gemm="triton")
    gen = torch.Generator(device="cuda").manual_seed(5)
    cublas_differs = False
    for n, k in ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)):
        x = torch.randn(2048, k, device="cuda", generator=gen).to(torch.bfloat16)
        w = (torch.randn(n, k, device="cuda", generator=gen) / k ** 0.5).to(torch.bfloat16)
        full = policy.linear(x, w)
        blocks = torch.cat([policy.linear(x[i: i + 256], w) for i in range(0, 2048, 256)])
        assert torch.equal(full, blocks)
        for row in (0, 777, 2047):
            assert torch.equal(policy.linear(x[row: row + 1], w), full[row: row + 1])
        perm = torch.randperm(2048, device="cuda", generator=gen)
        assert torch.equal(policy.linear(x[perm], w), full[perm])
        cublas_differs |= not torch.equal(torch.nn.functional.linear(x[:1], w),
                                          torch.nn.functional.linear(x, w)[:1])
    assert cublas_differs, "cuBLAS gave row 0 the same bits at M = 1 and M = 2,048 in every shape"


def test_wide_passes_with_the_triton_gemm_commit_the_bits_of_r_row_passes_on_cuda(llama8b, report):
    """The same deterministic requests as above under ``FixedShapePolicy(gemm="triton")``: passes of up to 1,024 rows
    run each GEMM once over all their rows, and commit the tokens, log-probs and prompt K/V of R-row passes; free
    requests beside them change nothing. Control: the Triton config with 32-key attention blocks (another canonical
    config) gives other K/V. (The cuBLAS config's K/V is reported, not asserted: on an H100 its 256-row blocks gave
    the Triton GEMM's bits exactly, round 31.)"""
    cfg, _ = llama8b
    prompts, params = wide_pass_requests(cfg.vocab_size)
    triton = FixedShapePolicy(gemm="triton")
    narrow = wide_pass_generator(llama8b, WINDOW * GROUP, canonical_policy=triton)
    reference = run_beside_random_free(narrow, prompts, params)
    reference_kv = prompt_kv(narrow, prompts[0], min_tokens=1025)
    narrow.close()
    wide = wide_pass_generator(llama8b, 4 * WINDOW * GROUP, canonical_policy=triton)
    alone = run_beside_random_free(wide, prompts, params)
    assert wide.stats["canonical_rows"] > 256 * wide.stats["canonical_passes"] - 256, "no wide pass ran"
    wide_kv = prompt_kv(wide, prompts[0], min_tokens=1025)
    wide.close()
    batched = run_beside_random_free(wide_pass_generator(llama8b, 4 * WINDOW * GROUP, canonical_policy=triton),
                                     prompts, params, num_free=24)
    report("triton_gemm_wide_pass_kv_equal", bool(torch.equal(wide_kv, reference_kv)))
    assert torch.equal(wide_kv, reference_kv)
    assert alone == reference
    assert batched == reference

    cublas = wide_pass_generator(llama8b, 4 * WINDOW * GROUP)
    run_beside_random_free(cublas, prompts[:1], params[:1])
    cublas_kv = prompt_kv(cublas, prompts[0], min_tokens=1025)
    cublas.close()
    report("triton_vs_cublas_kv_entries_differing", int((cublas_kv != reference_kv).sum()))
    other = wide_pass_generator(llama8b, 4 * WINDOW * GROUP,
                                canonical_policy=FixedShapePolicy(gemm="triton", key_block=32))
    run_beside_random_free(other, prompts[:1], params[:1])
    other_kv = prompt_kv(other, prompts[0], min_tokens=1025)
    other.close()
    assert not torch.equal(other_kv, reference_kv), "another canonical config gave the same K/V"


def test_wide_verify_passes_with_the_triton_gemm_commit_the_bits_of_r_row_passes_on_cuda(llama8b):
    cfg, _ = llama8b
    rng = random.Random(12)
    prompts = [[rng.randrange(3, cfg.vocab_size) for _ in range(rng.randint(8, 40))] for _ in range(40)]
    params = [SamplingParams(max_new_tokens=48, deterministic=True, ignore_eos=True, logprobs=True,
                             temperature=0.0 if i % 2 else 0.8, seed=200 + i) for i in range(40)]
    triton = FixedShapePolicy(gemm="triton")
    narrow = wide_pass_generator(llama8b, WINDOW * GROUP, canonical_policy=triton)
    reference = run_beside_random_free(narrow, prompts, params)
    narrow.close()
    wide = wide_pass_generator(llama8b, 4 * WINDOW * GROUP, wide_verify=True, canonical_policy=triton)
    windows = count_windows(wide)
    got = run_beside_random_free(wide, prompts, params, num_free=16)
    wide.close()
    assert max(windows) > GROUP, f"no pass held more than G windows: {windows}"
    assert got == reference


class _HeadRows(FixedShapePolicy):
    """``FixedShapePolicy(gemm="triton")`` recording the rows the output head (the vocabulary-wide GEMM) runs on."""

    def __init__(self, vocab_size: int):
        super().__init__(gemm="triton")
        self.vocab_size, self.head_rows = vocab_size, []

    def linear(self, x, weight, bias=None):
        if weight.shape[0] == self.vocab_size:
            self.head_rows.append(x.shape[0])
        return super().linear(x, weight, bias)


def test_a_triton_head_on_the_wanted_rows_commits_the_bits_of_an_r_row_head_on_cuda(llama8b, monkeypatch, report):
    """With the Triton GEMM a pass runs its output head and sampler on the rows it wants (8 / 64 / 512 result
    rows: a prompt chunk's last row, short windows) instead of R = 256: narrow and wide passes, next to free
    requests, commit the tokens, log-probs and top alternatives of passes whose head runs on every row
    (``pass_shapes.SMALLEST_RESULTS`` raised past R, the behaviour before round 21). Not vacuous: the head did run on
    fewer than R rows."""
    cfg, _ = llama8b
    prompts, params = wide_pass_requests(cfg.vocab_size)
    policy = _HeadRows(cfg.vocab_size)
    got = {}
    for tokens in (WINDOW * GROUP, 4 * WINDOW * GROUP):
        gen = wide_pass_generator(llama8b, tokens, canonical_policy=policy)
        got[tokens] = run_beside_random_free(gen, prompts, params, num_free=8)
        gen.close()
    report("triton_head_rows_seen", sorted(set(policy.head_rows)))
    assert min(policy.head_rows) < WINDOW * GROUP, f"every head ran on R rows or more: {sorted(set(policy.head_rows))}"
    monkeypatch.setattr(pass_shapes, "SMALLEST_RESULTS", 1 << 30)  # no result sizes below R: every row's head
    everyone = _HeadRows(cfg.vocab_size)
    gen = wide_pass_generator(llama8b, WINDOW * GROUP, canonical_policy=everyone)
    reference = run_beside_random_free(gen, prompts, params)
    gen.close()
    assert min(everyone.head_rows) >= WINDOW * GROUP
    assert got[WINDOW * GROUP] == reference
    assert got[4 * WINDOW * GROUP] == reference
