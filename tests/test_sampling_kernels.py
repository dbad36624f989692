"""The CUDA sampler's Triton kernels (llm42.kernels.sampling): exact against torch where exactness is defined,
a row's result independent of the other rows, Gumbel draws following the softmax.

On CUDA the checks run directly (``-m gpu``); without CUDA they run under Triton's interpreter
(TRITON_INTERPRET=1, in a subprocess, as the interpreter is chosen when the kernels are defined)
when Triton is installed, at small sizes.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def run_checks(device: str, vocab: int = 5003, num_rows: int = 9) -> None:
    from llm42.kernels.sampling import BLOCK_V, gumbel_argmax, row_stats
    from llm42.sampler import noise_keys

    assert vocab > 2 * BLOCK_V, "the checks need several vocabulary blocks"
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(num_rows, vocab, generator=gen) * 4).to(device)
    logits[3, 17] = logits[3, 4000] = 1e4  # a tie across blocks: the first index wins, as torch.argmax
    logits[5, :] = 0.0  # an all-equal row
    argmax, row_max, sumexp = row_stats(logits)
    assert torch.equal(argmax.cpu(), torch.argmax(logits.cpu(), dim=-1))
    assert torch.equal(row_max.cpu(), logits.cpu().amax(-1))
    want = torch.log_softmax(logits.cpu().double(), -1).gather(1, argmax.cpu()[:, None]).squeeze(1)
    got = (logits.gather(1, argmax[:, None]).squeeze(1) - row_max - torch.log(sumexp)).cpu().double()
    assert torch.allclose(got, want, atol=1e-5, rtol=0), (got - want).abs().max()

    # a row's results are the same alone, at another index, and next to different rows
    keys = noise_keys(torch.arange(num_rows, device=device) * 7919 + 3, torch.arange(num_rows, device=device) + 11)
    threshold = torch.full((num_rows,), float("-inf"), device=device)
    threshold[2] = logits[2].sort(descending=True).values[40]  # row 2: top-41 only
    drawn = gumbel_argmax(logits, threshold, keys)
    other = torch.randn(num_rows, vocab, generator=gen).to(device) * 10
    for i in range(num_rows):
        alone = row_stats(logits[i:i + 1])
        assert all(torch.equal(a[i:i + 1], b) for a, b in zip((argmax, row_max, sumexp), alone))
        mixed = torch.cat([other[:i], logits[i:i + 1], other[i + 1:]])
        assert torch.equal(row_stats(mixed)[2][i], sumexp[i])
        assert torch.equal(gumbel_argmax(logits[i:i + 1], threshold[i:i + 1], keys[i:i + 1]), drawn[i:i + 1])
        assert torch.equal(gumbel_argmax(mixed, threshold, keys)[i], drawn[i])
    assert bool(logits[2, drawn[2]] >= threshold[2])  # the filter holds
    assert torch.equal(gumbel_argmax(logits, None, keys), gumbel_argmax(logits, torch.full_like(threshold, float("-inf")), keys))
    # negative control: different keys give different draws (the noise is there)
    assert not torch.equal(gumbel_argmax(logits, None, keys + 1), gumbel_argmax(logits, None, keys))

    # the runner-up (the fast path's draft margins): the second largest value, the winner's bits unchanged
    argmax2, row_max2, sumexp2, second = row_stats(logits, runner_up=True)
    assert all(torch.equal(a, b) for a, b in zip((argmax, row_max, sumexp), (argmax2, row_max2, sumexp2)))
    masked = logits.cpu().scatter(1, argmax.cpu()[:, None], float("-inf"))
    assert torch.equal(second.cpu(), masked.amax(-1))
    assert float(second[3]) == 1e4 and float(second[5]) == 0.0  # a tie: the runner-up is the max again
    drawn2, best, second_draw = gumbel_argmax(logits, threshold, keys, runner_up=True)
    assert torch.equal(drawn2, drawn)
    scores = logits.cpu() - torch.log(-torch.log(_uniforms(keys.cpu(), vocab)))
    scores = torch.where(logits.cpu() >= threshold.cpu()[:, None], scores, float("-inf"))
    assert torch.allclose(best.cpu(), scores.gather(1, drawn.cpu()[:, None]).squeeze(1), rtol=0, atol=1e-4)
    runner = scores.scatter(1, drawn.cpu()[:, None], float("-inf")).amax(-1)
    assert torch.allclose(second_draw.cpu(), runner, rtol=0, atol=1e-4)
    assert bool((best >= second_draw).all())

    # Gumbel-max draws follow the softmax: one row of 8 tokens, 1,500 keys
    small = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -1.0, -2.0, -3.0]], device=device).repeat(1500, 1)
    counts = torch.bincount(gumbel_argmax(small, None, noise_keys(torch.arange(1500, device=device),
                                                                  torch.zeros(1500, device=device))).cpu(),
                            minlength=8).double()
    expected = torch.softmax(small[0].cpu().double(), -1) * 1500
    assert float(((counts - expected) ** 2 / expected).sum()) < 30.0  # chi-square, 7 dof: p < 1e-4 beyond 30


def _uniforms(keys: torch.Tensor, vocab: int) -> torch.Tensor:
    """The kernel's u per (row, vocab id), in float32 as the kernel computes it (a torch mirror of its hash)."""
    from llm42.sampler import _mix32

    vocab_ids = torch.arange(vocab, dtype=torch.int64)
    bits = _mix32(_mix32(keys[:, None] ^ (vocab_ids[None, :] * 0x27D4EB2F & 0xFFFFFFFF)) ^ 0x165667B1)
    return ((bits >> 9).to(torch.float32) * 2.0 + 1.0) * (1.0 / (1 << 24))


@pytest.mark.gpu
def test_sampling_kernels_on_cuda():
    run_checks("cuda", vocab=128256, num_rows=24)


def test_sampling_kernels_under_the_triton_interpreter():
    if importlib.util.find_spec("triton") is None:
        pytest.skip("Triton is not installed (CPU torch does not ship it); the CUDA run covers these kernels")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    proc = subprocess.run([sys.executable, "-c", "from tests.test_sampling_kernels import run_checks; run_checks('cpu')"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
