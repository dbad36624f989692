"""``FixedShapePolicy(gemm_rows=N)`` on CUDA: cuBLAS at M = N, a row's bits its own at any pass width.

The CPU suite (tests/test_gemm_rows.py) checks the blocks and the engine's use of them with a stand-in GEMM; here the
GEMM is cuBLAS's, and what the config rests on is measured: at M = N a row gets the same bits wherever it sits
(alone and padded, in blocks, shuffled; SmolLM2's and the 8B shape's weights), and passes of any width commit the
same tokens, log-probs, top alternatives and prompt K/V. Control: cuBLAS at M = 1 and at M = N differ somewhere in
these shapes, so the comparisons can see a GEMM at the wrong M.
"""

from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("triton")

from llm42 import SamplingParams  # noqa: E402
from llm42.policies import FixedShapePolicy  # noqa: E402
from tests.helpers import (WIDE_GROUP, WIDE_WINDOW, count_windows, prompt_kv, run_beside_random_free,  # noqa: E402
                           wide_pass_generator, wide_pass_requests)

pytestmark = pytest.mark.gpu

WINDOW, GROUP = WIDE_WINDOW, WIDE_GROUP
SMOLLM2_SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576))
LLAMA8B_SHAPES = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336))


@pytest.mark.parametrize("gemm_rows", [512, 1024, 2048])
def test_fixed_gemm_rows_give_a_row_its_bits_at_any_number_of_rows(gemm_rows, report):
    policy = FixedShapePolicy(gemm_rows=gemm_rows)
    gen = torch.Generator(device="cuda").manual_seed(gemm_rows)
    cublas_differs = []
    for n, k in SMOLLM2_SHAPES + LLAMA8B_SHAPES:
        x = torch.randn(2048, k, device="cuda", generator=gen).to(torch.bfloat16)
        w = (torch.randn(n, k, device="cuda", generator=gen) / k ** 0.5).to(torch.bfloat16)
        full = policy.linear(x, w)
        assert torch.equal(torch.cat([policy.linear(x[i: i + 256], w) for i in range(0, 2048, 256)]), full)
        for row in (0, 777, 2047):
            assert torch.equal(policy.linear(x[row: row + 1], w), full[row: row + 1]), (n, k, row)
        assert torch.equal(policy.linear(x[300: 300 + 37], w), full[300: 300 + 37])
        perm = torch.randperm(2048, device="cuda", generator=gen)
        assert torch.equal(policy.linear(x[perm], w), full[perm]), (n, k)
        one = torch.nn.functional.linear(x[:1], w)
        if not torch.equal(one, torch.nn.functional.linear(x[:gemm_rows], w)[:1]):
            cublas_differs.append(f"{n}x{k}")
    report(f"gemm_rows_{gemm_rows}_shapes_where_m1_differs", cublas_differs)
    assert cublas_differs, f"cuBLAS gave row 0 the same bits at M = 1 and M = {gemm_rows} in every shape"








def test_passes_of_any_width_with_fixed_gemm_rows_commit_the_same_bits_on_cuda(llama8b, report):
    """``gemm_rows=1024`` on the 8B shape: narrow passes (256 rows, every GEMM padded to 1,024), passes of up to
    1,024 rows (buckets of 256 and 512 rows padding their GEMMs' one block, and of one whole block) and the same
    beside free requests commit the same tokens, log-probs, top alternatives and prompt K/V (1,500- and 700-token
    prompts, one greedy, one sampled)."""
    cfg, _ = llama8b
    prompts, params = wide_pass_requests(cfg.vocab_size)
    policy = FixedShapePolicy(gemm_rows=1024)
    narrow = wide_pass_generator(llama8b, WINDOW * GROUP, canonical_policy=policy)
    assert narrow.verifier.canonical_pass.buckets == (256,)
    reference = run_beside_random_free(narrow, prompts, params)
    reference_kv = prompt_kv(narrow, prompts[0], min_tokens=1025)
    narrow.close()
    wide = wide_pass_generator(llama8b, 4 * WINDOW * GROUP, canonical_policy=policy)
    assert wide.verifier.canonical_pass.buckets == (256, 512, 1024)
    alone = run_beside_random_free(wide, prompts, params)
    wide_kv = prompt_kv(wide, prompts[0], min_tokens=1025)
    wide.close()
    batched = run_beside_random_free(wide_pass_generator(llama8b, 4 * WINDOW * GROUP, canonical_policy=policy),
                                     prompts, params, num_free=24)
    report("gemm_rows_1024_wide_pass_kv_equal", bool(torch.equal(wide_kv, reference_kv)))
    assert torch.equal(wide_kv, reference_kv)
    assert alone == reference
    assert batched == reference

    default = wide_pass_generator(llama8b, 4 * WINDOW * GROUP)  # M = R: another canonical config
    run_beside_random_free(default, prompts[:1], params[:1])
    default_kv = prompt_kv(default, prompts[0], min_tokens=1025)
    default.close()
    report("gemm_rows_1024_vs_default_kv_entries_differing", int((default_kv != reference_kv).sum()))


def test_wide_verify_passes_with_fixed_gemm_rows_commit_the_bits_of_narrow_passes_on_cuda(llama8b):
    cfg, _ = llama8b
    rng = random.Random(12)
    prompts = [[rng.randrange(3, cfg.vocab_size) for _ in range(rng.randint(8, 40))] for _ in range(40)]
    params = [SamplingParams(max_new_tokens=48, deterministic=True, ignore_eos=True, logprobs=True,
                             temperature=0.0 if i % 2 else 0.8, seed=200 + i) for i in range(40)]
    policy = FixedShapePolicy(gemm_rows=512)
    narrow = wide_pass_generator(llama8b, WINDOW * GROUP, canonical_policy=policy)
    reference = run_beside_random_free(narrow, prompts, params)
    narrow.close()
    wide = wide_pass_generator(llama8b, 4 * WINDOW * GROUP, wide_verify=True, canonical_policy=policy)
    assert wide.verifier.canonical_pass.buckets == (256, 512, 1024)
    windows = count_windows(wide)
    got = run_beside_random_free(wide, prompts, params, num_free=16)
    wide.close()
    assert max(windows) > GROUP, f"no pass held more than G windows: {windows}"
    assert got == reference
