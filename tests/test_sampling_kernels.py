"""The CUDA sampler's Triton kernels (llm42.kernels.sampling): exact against torch where exactness is defined,
a row's result independent of the other rows, Gumbel draws following the softmax.

On CUDA the checks run directly (``-m gpu``); without CUDA they run under Triton's interpreter
(TRITON_INTERPRET=1, in a subprocess, as the interpreter is chosen when the kernels are defined)
when Triton is installed, at small sizes.
"""

from __future__ import annotations

import contextlib
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

    check_scaling(logits, keys, device)
    check_split(logits, threshold, keys, device)

    # Gumbel-max draws follow the softmax: one row of 8 tokens, 1,500 keys
    small = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -1.0, -2.0, -3.0]], device=device).repeat(1500, 1)
    counts = torch.bincount(gumbel_argmax(small, None, noise_keys(torch.arange(1500, device=device),
                                                                  torch.zeros(1500, device=device))).cpu(),
                            minlength=8).double()
    expected = torch.softmax(small[0].cpu().double(), -1) * 1500
    assert float(((counts - expected) ** 2 / expected).sum()) < 30.0  # chi-square, 7 dof: p < 1e-4 beyond 30


def check_scaling(logits: torch.Tensor, keys: torch.Tensor, device: str) -> None:
    """The Gumbel kernel's own scaling (``scale=``, the fused CUDA sampler) against ``llm42.sampler._scaled``'s
    torch ops on a float32 copy: the same bits from bf16 logits (as the head writes them) and from float32 ones,
    with greedy rows (T = 0), a temperature whose ``|max| / T`` overflows, a threshold; and a control."""
    from llm42.kernels.sampling import gumbel_argmax, row_stats
    from llm42.sampler import SamplingRows, _scaled

    num_rows = logits.shape[0]
    gen = torch.Generator().manual_seed(1)
    temps = (torch.rand(num_rows, generator=gen) * 1.5 + 0.05).to(device)
    # greedy (scaled by 1), overflowing at a subnormal T, exactly 1, overflowing at a normal T, T < 1 on a row
    # holding a subnormal logit (x / T is a normal float: a flush to zero would show)
    temps[0], temps[1], temps[4], temps[6], temps[7] = 0.0, 1e-40, 1.0, 2e-38, 0.01
    logits = logits.clone()
    logits[7, 11] = 1e-39
    rows = SamplingRows(temperature=temps, top_k=torch.zeros(num_rows, dtype=torch.int64, device=device),
                        top_p=torch.ones(num_rows, device=device), seeds=keys, positions=keys)
    for dtype in (torch.bfloat16, torch.float32):
        x = logits.to(dtype)
        _, row_max, _, row_min = row_stats(x, row_min=True)
        assert torch.equal(row_min, x.float().amin(-1)) and torch.equal(row_max, x.float().amax(-1))
        assert len(row_stats(x)) == 3 and torch.equal(row_stats(x, runner_up=True, row_min=True)[4], row_min)
        scaled = _scaled(x.float(), rows, row_max)  # the torch ops the unfused sampler runs
        assert float(scaled[1].max()) == 0.0 and float(scaled[6].max()) == 0.0, "rows 1, 6 take (x - max) / T"
        assert float(scaled[7, 11]) > 1.18e-38 > float(x[7, 11].float()) > 0, "a subnormal logit, a normal x / T"
        want = gumbel_argmax(scaled, None, keys, runner_up=True)
        got = gumbel_argmax(x, None, keys, runner_up=True, scale=(temps, row_max, row_min))
        assert all(torch.equal(a, b) for a, b in zip(got, want)), dtype
        assert torch.equal(gumbel_argmax(x, None, keys, scale=(temps, row_max, row_min)), want[0])
        # sampled_only (the sampler's call): the sampled rows' bits; a greedy row reads nothing, draws 0 at -inf
        only = gumbel_argmax(x, None, keys, runner_up=True, scale=(temps, row_max, row_min), sampled_only=True)
        sampled = temps > 0
        assert all(torch.equal(a[sampled], b[sampled]) for a, b in zip(only, want))
        assert int(only[0][0]) == 0 and float(only[1][0]) == float("-inf") == float(only[2][0])
        threshold = scaled.sort(dim=-1, descending=True).values[:, 30]  # every row: its top 31 scaled values
        assert torch.equal(gumbel_argmax(x, threshold, keys, scale=(temps, row_max, row_min)),
                           gumbel_argmax(scaled, threshold, keys))
        # control: a temperature one float32 step higher moves the sampled rows' winning scores
        nudged = torch.nextafter(temps, torch.full_like(temps, float("inf")))
        moved = gumbel_argmax(x, None, keys, runner_up=True, scale=(nudged, row_max, row_min))[1]
        assert not torch.equal(moved[2:], got[1][2:])


def check_split(logits: torch.Tensor, threshold: torch.Tensor, keys: torch.Tensor, device: str) -> None:
    """The Gumbel sweep split over several programs per row (``GUMBEL_TARGET_PROGRAMS``) gives one sweep's bits:
    token, winning value and runner-up, with a threshold, the kernel's scaling and greedy rows skipped; a tie at
    +inf across chunks keeps the first index, a row with nothing kept draws token 0 at -inf; and a control."""
    from llm42.kernels import sampling
    from llm42.kernels.sampling import BLOCK_V, gumbel_argmax, gumbel_chunks, row_stats

    num_rows, vocab = logits.shape
    blocks = -(-vocab // BLOCK_V)
    logits = logits.clone()
    logits[4, 100] = logits[4, 3 * BLOCK_V // 2] = logits[4, vocab - 1] = float("inf")  # a tie in three blocks
    threshold = threshold.clone()
    threshold[6] = float("inf")  # nothing kept
    temps = torch.linspace(0.0, 1.5, num_rows).to(device)  # row 0 greedy
    _, row_max, _, row_min = row_stats(logits, row_min=True)
    calls = {"plain": lambda: gumbel_argmax(logits, threshold, keys, runner_up=True),
             "scaled": lambda: gumbel_argmax(logits, None, keys, runner_up=True, scale=(temps, row_max, row_min),
                                             sampled_only=True),
             "tokens": lambda: (gumbel_argmax(logits, threshold, keys),)}
    old = sampling.GUMBEL_TARGET_PROGRAMS
    try:
        sampling.GUMBEL_TARGET_PROGRAMS = None
        assert gumbel_chunks(num_rows, vocab) == (blocks, 1)
        want = {name: call() for name, call in calls.items()}
        token, best, second = (t[4] for t in want["plain"])
        assert int(token) == 100 and float(best) == float("inf") == float(second)
        assert int(want["plain"][0][6]) == 0 and float(want["plain"][1][6]) == float("-inf")
        for target in (2 * num_rows, 3 * num_rows, 1000 * num_rows):
            sampling.GUMBEL_TARGET_PROGRAMS = target
            chunk_blocks, chunks = gumbel_chunks(num_rows, vocab)
            assert chunks > 1 and chunk_blocks * chunks >= blocks > chunk_blocks * (chunks - 1)
            for name, call in calls.items():
                got = call()
                assert all(torch.equal(a, b) for a, b in zip(got, want[name])), (target, name)
        # control: the split's merge sees a changed chunk (another key for one row moves that row's draw)
        moved = gumbel_argmax(logits, None, keys + (torch.arange(num_rows, device=device) == 2), runner_up=True)
        assert not torch.equal(moved[1], gumbel_argmax(logits, None, keys, runner_up=True)[1])
    finally:
        sampling.GUMBEL_TARGET_PROGRAMS = old


def _reference_threshold(raw: torch.Tensor, temperature: float, top_k: int, top_p: float) -> tuple[float, float]:
    """``filter_threshold``'s definition in float64 on one row of raw logits (CPU): (the threshold logit, how close
    the row's top-p mass came to deciding between two logits, relative: where tiny, float32 sums may decide
    otherwise)."""
    x = raw.double()
    vocab = len(x)
    k = top_k if 0 < top_k < vocab else vocab
    kth = float(x.sort(descending=True).values[k - 1])
    weight = torch.exp((x - x.max()) / temperature)
    above = x > kth
    total = float(weight[above].sum()) + (k - int(above.sum())) * float(torch.exp((kth - x.max()) / temperature))
    if top_p >= 1.0:
        return kth, float("inf")
    values, group = torch.unique(x[above], sorted=True, return_inverse=True)  # the logits above the k-th, ascending
    if len(values) == 0:
        return kth, float("inf")
    group_mass = torch.zeros(len(values), dtype=torch.float64).index_add_(0, group, weight[above])
    at_or_above = group_mass.flip(0).cumsum(0).flip(0)  # [i]: the mass of the logits >= values[i]
    holds = (at_or_above >= top_p * total).nonzero()
    threshold = float(values[int(holds[-1])]) if len(holds) else kth  # the largest logit that holds
    return threshold, float(((at_or_above - top_p * total).abs() / total).min())


def check_filter(device: str, vocab: int = 1500, num_rows: int = 12) -> None:
    """``filter_threshold`` (the top-k / top-p threshold's search) on bf16, fp16 and float32 logits, with a row's
    search split as the tree splits it (``FILTER_CHUNK_BLOCKS``), over one block per program (several programs a
    row, the last one ragged), in one program per row, and with 16 pivots a pass (``FILTER_FAN``, round 55's):
    the float64 definition's threshold wherever the row's mass is not at an edge, scaled as the Gumbel kernel
    scales (one of the row's scaled values); a row's value the same alone and among other rows; greedy and
    unfiltered rows -inf; and controls (a smaller top-p or top-k moves its row's threshold up, and no other
    row's). Then ``check_filter_edges``."""
    for launch in ({}, {"FILTER_CHUNK_BLOCKS": 1}, {"FILTER_CHUNK_BLOCKS": None}, {"FILTER_FAN": 16}):
        with _filter_launch(**launch):
            _check_filter_split(device, vocab, num_rows)
    check_filter_edges(device)


@contextlib.contextmanager
def _filter_launch(**values):
    """``kernels.sampling``'s launch constants (``FILTER_*``) set to ``values`` inside the block, restored after."""
    from llm42.kernels import sampling

    old = {name: getattr(sampling, name) for name in values}
    try:
        for name, value in values.items():
            setattr(sampling, name, value)
        yield
    finally:
        for name, value in old.items():
            setattr(sampling, name, value)


def _check_filter_split(device: str, vocab: int, num_rows: int) -> None:
    """``check_filter`` at one split."""
    from llm42.kernels.sampling import filter_threshold, row_stats
    from llm42.sampler import SamplingRows, _scaled

    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(num_rows, vocab, generator=gen) * 3
    logits[4, :] = 1.0  # one value
    logits[5, 100:] = float("-inf")  # a masked vocabulary
    logits[6, :10] = 9.0  # a tie at the top
    temps = (torch.rand(num_rows, generator=gen) * 1.5 + 0.3).to(device)
    temps[0], temps[9] = 0.0, 1e-40  # greedy (never filtered); |max| / T overflows: only the max weighs
    temps[3] = 1.0  # the top-p control's row: its top-p of 0.5 keeps several tokens at any vocabulary here
    top_k = torch.tensor([5, 0, 40, 0, 3, 0, 4, 1, 0, 7, vocab, 0], device=device)
    top_p = torch.tensor([0.9, 0.9, 1.0, 0.5, 0.8, 0.95, 1.0, 0.3, 0.99, 0.6, 0.7, 1.0], device=device)
    rows = SamplingRows(temperature=temps, top_k=top_k, top_p=top_p, seeds=top_k, positions=top_k)
    checked = 0
    for dtype in (torch.float16, torch.float32, torch.bfloat16):  # bf16 last: the checks below use it
        x = logits.to(device, dtype)
        _, row_max, _, row_min = row_stats(x, row_min=True)
        got = filter_threshold(x, temps, row_max, row_min, top_k, top_p)
        scaled = _scaled(x.float(), rows, row_max)
        assert float(got[0]) == float("-inf") and float(got[11]) == float("-inf")  # greedy; no filter
        for i in range(1, num_rows - 1):
            raw = x[i].float().cpu()
            want, margin = _reference_threshold(raw, float(temps[i]), int(top_k[i]), float(top_p[i]))
            at = scaled[i].cpu()[raw == want]  # the scaled value of the threshold logit
            if margin > 1e-4:
                assert float(got[i]) == float(at[0]), (dtype, i, float(got[i]), float(at[0]))
                checked += 1
            else:
                assert float(got[i]) in set(scaled[i].cpu().tolist()), (dtype, i)  # one of the row's own values
    assert checked >= 24, checked
    assert float(got[4]) == float(scaled[4, 0])  # one value: that value
    assert int((scaled[7] >= got[7]).sum()) == 1  # top-k 1
    assert float(got[9]) == float(scaled[9].max())  # a tiny T: the max alone

    # a row's threshold is its own: alone, among other rows
    other = (torch.randn(num_rows, vocab, generator=gen) * 5).to(device, torch.bfloat16)
    for i in (1, 3, 7):
        alone = filter_threshold(x[i:i + 1], temps[i:i + 1], row_max[i:i + 1], row_min[i:i + 1],
                                 top_k[i:i + 1], top_p[i:i + 1])
        assert torch.equal(alone, got[i:i + 1]), i
        mixed = torch.cat([other[:i], x[i:i + 1], other[i + 1:]])
        _, mixed_max, _, mixed_min = row_stats(mixed, row_min=True)
        assert torch.equal(filter_threshold(mixed, temps, mixed_max, mixed_min, top_k, top_p)[i], got[i]), i
    # controls: a smaller top-p or top-k moves its row's threshold up, and no other row's
    moved_p, moved_k = top_p.clone(), top_k.clone()
    moved_p[3], moved_k[2] = 0.05, 2
    moved = filter_threshold(x, temps, row_max, row_min, moved_k, moved_p)
    assert float(moved[3]) > float(got[3]) and float(moved[2]) > float(got[2])
    keep = torch.ones(num_rows, dtype=torch.bool, device=device)
    keep[[2, 3]] = False
    assert torch.equal(moved[keep], got[keep])


def check_filter_edges(device: str, cases: int = 24) -> None:
    """``filter_threshold`` on small, tied rows: vocabularies of 1 to 600 logits drawn from a few levels (ties
    everywhere, a tie at the k-th value), top-k from 1 to V, top-p from 1e-3 to 0.999, -inf logits: the float64
    definition's threshold wherever the mass is not at an edge, always one of the row's values keeping at least
    one token and, with top-k, fewer than k values above it. In the tree's launch, and with 64-value blocks, one a
    program (up to ten programs a row)."""
    for launch in ({}, {"FILTER_BLOCK": 64, "FILTER_CHUNK_BLOCKS": 1}):
        with _filter_launch(**launch):
            _check_filter_edges_at(device, cases)


def _check_filter_edges_at(device: str, cases: int) -> None:
    """``check_filter_edges`` in one launch."""
    from llm42.kernels.sampling import filter_threshold

    gen = torch.Generator().manual_seed(11)
    checked = 0
    for case in range(cases):
        vocab = (1, 2, 3, 7, 64, 600)[case % 6]
        levels = torch.randn(1 + case % 5, generator=gen) * 4
        row = levels[torch.randint(len(levels), (1, vocab), generator=gen)]
        if vocab > 2 and case % 4 == 0:
            row[0, torch.randint(vocab, (vocab // 3,), generator=gen)] = float("-inf")
            row[0, 0] = levels[0]
        top_k = torch.tensor([int(torch.randint(0, vocab + 1, (), generator=gen))])
        top_p = torch.tensor([(1e-3, 0.3, 0.7, 0.95, 0.999, 1.0)[case % 6]])
        if int(top_k) == 0 and float(top_p) == 1.0:
            top_k[0] = 1
        x = row.to(device)
        got = filter_threshold(x, torch.ones(1, device=device), x.amax(-1), x.amin(-1), top_k.to(device),
                               top_p.to(device))
        value = float(got[0])
        assert value in set(x[0].cpu().tolist()), (case, value)
        assert int((x[0] >= value).sum()) >= 1
        if int(top_k) > 0:
            assert int((x[0] > value).sum()) < int(top_k), case
        want, margin = _reference_threshold(x[0].cpu(), 1.0, int(top_k), float(top_p))
        if margin > 1e-4:
            assert value == want, (case, value, want)
            checked += 1
    assert checked >= cases // 2, checked


def _uniforms(keys: torch.Tensor, vocab: int) -> torch.Tensor:
    """The kernel's u per (row, vocab id), in float32 as the kernel computes it (a torch mirror of its hash)."""
    from llm42.sampler import _mix32

    vocab_ids = torch.arange(vocab, dtype=torch.int64)
    bits = _mix32(_mix32(keys[:, None] ^ (vocab_ids[None, :] * 0x27D4EB2F & 0xFFFFFFFF)) ^ 0x165667B1)
    return ((bits >> 9).to(torch.float32) * 2.0 + 1.0) * (1.0 / (1 << 24))


@pytest.mark.gpu
def test_sampling_kernels_on_cuda():
    run_checks("cuda", vocab=128256, num_rows=24)


@pytest.mark.parametrize("checks", ["run_checks", "check_filter"])
def test_sampling_kernels_under_the_triton_interpreter(checks):
    if importlib.util.find_spec("triton") is None:
        pytest.skip("Triton is not installed (CPU torch does not ship it); the CUDA run covers these kernels")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    proc = subprocess.run([sys.executable, "-c", f"from tests.test_sampling_kernels import {checks}; {checks}('cpu')"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.mark.gpu
def test_the_filter_threshold_kernel_on_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    check_filter("cuda", vocab=128256, num_rows=12)
    check_filter("cuda", vocab=49152, num_rows=12)


@pytest.mark.gpu
def test_the_fused_sampler_keeps_the_bits_on_cuda(monkeypatch):
    """``llm42.sampler.FUSED_CUDA_SAMPLER`` (bf16 logits read as they are, the temperature applied in the Gumbel
    kernel) against the torch ops on a float32 copy, and with greedy rows skipping the sweep and the sweep split
    (``kernels.sampling``): the same tokens, log-probs and margins, greedy and sampled; a step with a top-k row
    (the threshold's kernel, round 55; before, the float32 copy) gives every other row the fused step's bits; a
    control."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from llm42 import sampler
    from llm42.kernels import sampling
    from llm42.sampler import SamplingRows, sample, sample_with_margins

    gen = torch.Generator().manual_seed(2)
    for vocab in (128256, 49152):
        n = 64
        logits = (torch.randn(n, vocab, generator=gen) * 3).to("cuda", torch.bfloat16)
        temps = (torch.rand(n, generator=gen) * 1.5).cuda()
        temps[::5] = 0.0
        temps[1] = 1e-40
        ints = torch.arange(n, device="cuda")

        def rows(top_k, t=temps, sampled=True, filtered=False):
            return SamplingRows(temperature=t, top_k=top_k, top_p=torch.ones(n, device="cuda"), seeds=ints * 31 + 7,
                                positions=ints + 100, is_any_sampled=sampled, is_any_filtered=filtered)

        no_filter = torch.zeros(n, dtype=torch.int64, device="cuda")
        results = {}
        for fused, skip, programs in ((True, False, None), (False, False, None), (True, True, None), (True, True, 600)):
            monkeypatch.setattr(sampler, "FUSED_CUDA_SAMPLER", fused)
            monkeypatch.setattr(sampling, "GUMBEL_SKIP_GREEDY", skip)  # greedy rows skip the Gumbel sweep
            monkeypatch.setattr(sampling, "GUMBEL_TARGET_PROGRAMS", programs)  # and it splits over programs
            results[fused, skip, programs] = (
                sample_with_margins(logits, rows(no_filter)), sample(logits, rows(no_filter)),
                sample_with_margins(logits, rows(no_filter, t=torch.zeros_like(temps), sampled=False)))
        reference = results[True, False, None]
        for key, got in results.items():
            for a, b in zip(got, reference):
                assert all(torch.equal(x, y) for x, y in zip(a, b)), (vocab, key)
        results = {True: reference}
        monkeypatch.setattr(sampler, "FUSED_CUDA_SAMPLER", True)
        monkeypatch.setattr(sampling, "GUMBEL_SKIP_GREEDY", False)
        monkeypatch.setattr(sampling, "GUMBEL_TARGET_PROGRAMS", None)
        top_k = no_filter.clone()
        top_k[2] = 40
        filtered = sample_with_margins(logits, rows(top_k, filtered=True))  # the float32 copy's path
        keep = torch.arange(n, device="cuda") != 2
        assert all(torch.equal(x[keep], y[keep]) for x, y in zip(filtered, results[True][0]))
        # control: one row's temperature a float32 step higher moves that row's margin
        nudged = temps.clone()
        nudged[3] = torch.nextafter(nudged[3], torch.tensor(2.0, device="cuda"))
        moved = sample_with_margins(logits, rows(no_filter, t=nudged))[2]
        assert not torch.equal(moved[3], results[True][0][2][3]) and torch.equal(moved[4:], results[True][0][2][4:])


@pytest.mark.gpu
def test_the_filter_kernel_keeps_its_bits_in_the_sampler_and_a_graph_on_cuda(monkeypatch):
    """The threshold's kernel in the sampler (``FILTER_KERNEL``): the fused step (bf16 logits scaled in the kernels)
    against the float32 copy's (``FUSED_CUDA_SAMPLER=False``: the kernel on the same raw logits), eagerly and
    replayed from a graph: the same tokens, log-probs and margins; every row without a filter draws what a step
    without any filtered row draws; the torch filter (``FILTER_KERNEL=False``) agrees on the tokens of nearly every
    row. Control: a top-p changed in place moves that row's draw in the replay, and no other row's."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from llm42 import sampler
    from llm42.sampler import SamplingRows, sample_with_margins

    gen = torch.Generator().manual_seed(5)
    n, vocab = 200, 128256
    logits = (torch.randn(n, vocab, generator=gen) * 3).to("cuda", torch.bfloat16)
    temps = (torch.rand(n, generator=gen) * 1.5 + 0.05).cuda()
    temps[::4] = 0.0
    temps[7] = 1.0  # the control's row: its top-p of 0.7 keeps many tokens
    ints = torch.arange(n, device="cuda")
    top_k = torch.where(ints % 7 == 1, 20, 0)
    top_p = torch.where(ints % 3 == 1, 0.7, 1.0)
    top_p[[5, 9]] = 0.05  # almost greedy: a top-p of 0.05 keeps the largest value or few more

    def rows(p=top_p, k=top_k, filtered=True):
        return SamplingRows(temperature=temps, top_k=k, top_p=p, seeds=ints * 31 + 7, positions=ints + 100,
                            is_any_sampled=True, is_any_filtered=filtered)

    fused = sample_with_margins(logits, rows())
    monkeypatch.setattr(sampler, "FUSED_CUDA_SAMPLER", False)
    copied = sample_with_margins(logits, rows())
    monkeypatch.setattr(sampler, "FUSED_CUDA_SAMPLER", True)
    assert all(torch.equal(a, b) for a, b in zip(fused, copied))
    plain = sample_with_margins(logits, rows(torch.ones_like(top_p), torch.zeros_like(top_k), filtered=False))
    no_filter = (top_k == 0) & (top_p == 1.0)
    assert all(torch.equal(a[no_filter], b[no_filter]) for a, b in zip(fused, plain))
    monkeypatch.setattr(sampler, "FILTER_KERNEL", False)
    torch_filter = sample_with_margins(logits, rows())
    monkeypatch.setattr(sampler, "FILTER_KERNEL", True)
    assert float((torch_filter[0] == fused[0]).float().mean()) > 0.97
    static_p = top_p.clone()
    sample_with_margins(logits, rows(static_p))  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = sample_with_margins(logits, rows(static_p))
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(replayed, fused))
    static_p[7] = 0.01  # control: row 7 (sampled, top-p 0.7) now keeps its most likely token or few more
    graph.replay()
    torch.cuda.synchronize()
    keep = ints != 7
    assert all(torch.equal(a[keep], b[keep]) for a, b in zip(replayed, fused))
    assert not all(torch.equal(a[7], b[7]) for a, b in zip(replayed, fused))
