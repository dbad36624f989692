"""The sampler: greedy is argmax, seeded noise is a pure function of (seed, position, vocab id),
top-k/top-p restrict the support, and seeded draws follow the softmax distribution."""


import hypothesis.strategies as st
import torch
from hypothesis import given

from llm42.sampler import SamplingRows, gumbel_noise, sample


def rows(n, *, temperature=1.0, top_k=0, top_p=1.0, seeds=None, positions=None):
    return SamplingRows(
        temperature=torch.full((n,), float(temperature)),
        top_k=torch.full((n,), top_k, dtype=torch.int64),
        top_p=torch.full((n,), float(top_p)),
        seeds=torch.tensor(seeds if seeds is not None else [7] * n, dtype=torch.int64),
        positions=torch.tensor(positions if positions is not None else list(range(n)), dtype=torch.int64),
    )


@given(seed=st.integers(-(2**63), 2**63 - 1), position=st.integers(0, 1 << 20), others=st.integers(1, 6))
def test_noise_row_depends_only_on_seed_and_position(seed, position, others):
    alone = gumbel_noise(torch.tensor([seed]), torch.tensor([position]), 300)
    seeds = torch.tensor([seed ^ (i + 1) for i in range(others)] + [seed])
    positions = torch.tensor([position + 3 * i for i in range(others)] + [position])
    batched = gumbel_noise(seeds, positions, 300)
    assert torch.equal(alone[0], batched[-1])
    assert torch.isfinite(alone).all()


def test_noise_differs_across_seeds_positions_and_vocab():
    a = gumbel_noise(torch.tensor([1, 2, 1]), torch.tensor([5, 5, 6]), 1000)
    assert not torch.equal(a[0], a[1]) and not torch.equal(a[0], a[2])
    assert a[0].unique().numel() > 990


def test_noise_is_gumbel_distributed():
    g = gumbel_noise(torch.arange(64), torch.zeros(64, dtype=torch.int64), 4096).flatten()
    # Gumbel(0, 1): mean = Euler-Mascheroni constant, variance = pi^2 / 6
    assert abs(g.mean().item() - 0.5772) < 0.01
    assert abs(g.var().item() - 1.6449) < 0.03


def test_greedy_is_argmax_and_logprob_is_log_softmax():
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(0))
    tokens, logprobs = sample(logits, rows(5, temperature=0.0))
    assert torch.equal(tokens, logits.argmax(-1))
    expected = torch.log_softmax(logits.double(), -1).gather(1, tokens[:, None]).squeeze(1)
    # the exact log-softmax is rounded once from float64: the float64 reference's rounding, within an ulp
    torch.testing.assert_close(logprobs, expected.float(), rtol=2**-23, atol=0)


def test_seeded_sampling_follows_the_softmax_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).repeat(20000, 1)
    tokens, _ = sample(logits, rows(20000, temperature=1.0, seeds=[3] * 20000))
    freq = torch.bincount(tokens, minlength=4).float() / 20000
    assert torch.allclose(freq, torch.softmax(logits[0], -1), atol=0.015)


def test_temperature_sharpens_the_distribution():
    logits = torch.tensor([[1.0, 0.0]]).repeat(20000, 1)
    cold, _ = sample(logits, rows(20000, temperature=0.25))
    hot, _ = sample(logits, rows(20000, temperature=4.0))
    assert (cold == 0).float().mean() > (hot == 0).float().mean() + 0.3


@given(top_k=st.integers(1, 10), seed=st.integers(0, 1000))
def test_top_k_restricts_support(top_k, seed):
    logits = torch.randn(64, 30, generator=torch.Generator().manual_seed(seed))
    tokens, _ = sample(logits, rows(64, temperature=2.0, top_k=top_k, seeds=[seed] * 64))
    allowed = logits.topk(top_k, dim=-1).indices
    assert (allowed == tokens[:, None]).any(-1).all()


@given(top_p=st.floats(0.05, 1.0), seed=st.integers(0, 1000))
def test_top_p_restricts_support_to_the_nucleus(top_p, seed):
    logits = torch.randn(64, 30, generator=torch.Generator().manual_seed(seed))
    tokens, _ = sample(logits, rows(64, temperature=1.0, top_p=top_p, seeds=[seed] * 64))
    probs = torch.softmax(logits, -1)
    sorted_probs, order = probs.sort(-1, descending=True)
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    for r in range(64):
        nucleus = set(order[r][mass_before[r] < top_p].tolist()) | {order[r][0].item()}
        assert tokens[r].item() in nucleus


def test_seeded_draw_is_reproducible_and_seed_sensitive():
    logits = torch.randn(8, 100, generator=torch.Generator().manual_seed(1))
    a, _ = sample(logits, rows(8, seeds=[11] * 8))
    b, _ = sample(logits, rows(8, seeds=[11] * 8))
    c, _ = sample(logits, rows(8, seeds=[12] * 8))
    assert torch.equal(a, b) and not torch.equal(a, c)


@given(temperature=st.sampled_from([1e-40, 1e-38]), seed=st.integers(0, 1 << 30),
       top_k=st.sampled_from([0, 5]), top_p=st.sampled_from([1.0, 0.9]))
def test_tiny_temperature_samples_the_argmax(temperature, seed, top_k, top_p):
    # logits / T overflows to inf here: the sampler must still give the (unique) argmax
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(4, 300, generator=g) * 8
    r = rows(4, temperature=temperature, top_k=top_k, top_p=top_p, seeds=[seed] * 4)
    tokens, logprobs = sample(logits, r)
    assert torch.equal(tokens, logits.argmax(-1))
    assert torch.isfinite(logprobs).all()
    # negative control: the unshifted quotient overflows and draws junk, so the test is not vacuous
    assert torch.isinf(logits / r.temperature[:, None]).any()
    assert not torch.equal(_unshifted_draw(logits, r), logits.argmax(-1))


def _unshifted_draw(logits, r):
    # the sampler's formula before the tiny-temperature fix: argmax(filter(logits / T) + g)
    from llm42.sampler import _filter_threshold

    scaled = logits / r.temperature[:, None]
    scaled = torch.where(scaled >= _filter_threshold(scaled, r.top_k, r.top_p), scaled, float("-inf"))
    return torch.argmax(scaled + gumbel_noise(r.seeds, r.positions, logits.shape[-1]), dim=-1)


@given(temperature=st.floats(1e-3, 5.0), seed=st.integers(0, 1 << 30), top_k=st.sampled_from([0, 3, 40]),
       top_p=st.sampled_from([1.0, 0.95, 0.5]))
def test_ordinary_temperatures_keep_their_bits(temperature, seed, top_k, top_p):
    # the overflow fallback touches only overflowing rows: every other draw is what it was
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(6, 257, generator=g) * 4
    r = rows(6, temperature=temperature, top_k=top_k, top_p=top_p, seeds=list(range(seed, seed + 6)))
    tokens, _ = sample(logits, r)
    assert torch.equal(tokens, _unshifted_draw(logits, r))


@given(seed=st.integers(0, 1 << 30), num_rows=st.integers(2, 24), chunk_rows=st.integers(1, 7))
def test_the_filter_threshold_in_chunks_of_rows_has_the_bits_of_one_call(seed, num_rows, chunk_rows):
    """``FILTER_CHUNK_ELEMENTS`` (round 53: the mixed step's graphs ran out of memory on the filter's temporaries)
    cuts the rows into chunks; each row's threshold, and so every top-k / top-p draw, must not move. Rows draw
    their own top-k / top-p (some unfiltered, some with ties: rounded logits). Control: the same rows with row 0's
    filter switched (off, or to top-1) move that row's threshold and no other, so equal thresholds are not vacuous."""
    import llm42.sampler as sampler

    g = torch.Generator().manual_seed(seed)
    vocab = 97
    scaled = (torch.randn(num_rows, vocab, generator=g) * 3).round(decimals=1)  # ties within a row
    top_k = torch.randint(0, 12, (num_rows,), generator=g)
    top_p = torch.where(torch.rand(num_rows, generator=g) < 0.7, torch.rand(num_rows, generator=g), 1.0)
    top_k[-1] = 5  # at least one row filters
    whole = sampler._filter_threshold_rows(scaled, top_k, top_p)
    saved = sampler.FILTER_CHUNK_ELEMENTS
    sampler.FILTER_CHUNK_ELEMENTS = chunk_rows * vocab
    try:
        chunked = sampler._filter_threshold(scaled, top_k, top_p)
        r = SamplingRows(temperature=torch.full((num_rows,), 0.9), top_k=top_k, top_p=top_p,
                         seeds=torch.arange(num_rows), positions=torch.arange(num_rows))
        chunked_draw = sample(scaled, r)
    finally:
        sampler.FILTER_CHUNK_ELEMENTS = saved
    assert torch.equal(chunked.view(torch.int32), whole.view(torch.int32))  # bit for bit, -inf rows included
    assert all(torch.equal(a, b) for a, b in zip(chunked_draw, sample(scaled, r)))
    assert bool(torch.isfinite(whole).any())  # some row filters
    is_filtered = bool(top_k[0] > 0 or top_p[0] < 1.0)
    moved_k, moved_p = top_k.clone(), top_p.clone()  # row 0 unfiltered (-inf) if it filtered, else top-1 (finite)
    moved_k[0], moved_p[0] = (0, 1.0) if is_filtered else (1, 1.0)
    control = sampler._filter_threshold_rows(scaled, moved_k, moved_p)
    assert torch.equal(control[1:], whole[1:])
    assert bool(torch.isfinite(control[0])) != bool(torch.isfinite(whole[0]))


@given(seed=st.integers(0, 1 << 30), num_rows=st.integers(2, 24))
def test_the_filter_threshold_of_the_filtered_rows_alone_has_the_bits_of_every_row(seed, num_rows):
    """On the CPU ``_filter_threshold`` sorts only the rows with a filter (a step with one top-p row among many
    sorts one row): every threshold, and so every draw, is that of the filter over all rows. Control: without one
    row's filter that row's threshold goes to -inf and no other moves, so the comparison is not vacuous."""
    import llm42.sampler as sampler

    g = torch.Generator().manual_seed(seed)
    vocab = 89
    scaled = (torch.randn(num_rows, vocab, generator=g) * 3).round(decimals=1)
    top_k = torch.where(torch.rand(num_rows, generator=g) < 0.3, torch.randint(1, 12, (num_rows,), generator=g), 0)
    top_p = torch.where(torch.rand(num_rows, generator=g) < 0.3, torch.rand(num_rows, generator=g), 1.0)
    top_k[-1] = 5  # at least one row filters
    whole = sampler._filter_threshold_rows(scaled, top_k, top_p)
    got = sampler._filter_threshold(scaled, top_k, top_p)
    assert torch.equal(got.view(torch.int32), whole.view(torch.int32))
    r = SamplingRows(temperature=torch.ones(num_rows), top_k=top_k, top_p=top_p, seeds=torch.arange(num_rows),
                     positions=torch.arange(num_rows), is_any_sampled=True, is_any_filtered=True)
    every_row = sampler._sample(scaled, r, with_margins=True)  # T = 1: the sampler thresholds these values
    kept = torch.where(scaled >= whole, scaled, float("-inf"))
    drawn = sampler._draw(kept, None, r, runner_up=True)
    assert torch.equal(every_row[0], drawn[0])
    control = sampler._filter_threshold(scaled, torch.cat([top_k[:-1], top_k.new_zeros(1)]),
                                        torch.cat([top_p[:-1], top_p.new_ones(1)]))
    assert bool(torch.isfinite(whole[-1])) and not bool(torch.isfinite(control[-1]))
    assert torch.equal(control[:-1], whole[:-1])
