"""Wide canonical passes: long deterministic prompts in passes of more than R rows, same bits.

A pass of up to ``max_canonical_tokens`` rows (a multiple of R) runs its GEMMs on R-row blocks
(``GemmRowBlocks``) and its head and sampler on R selected rows, so every row gets the bits an
R-row pass gives it. These tests run the same deterministic requests with narrow passes
(``max_canonical_tokens = R``) and wide ones and compare tokens, log-probs, top alternatives and
the prompts' canonical K/V bit for bit; a negative control shows that a policy whose GEMM rows
depend on M would break that equality without the R-row blocks.
"""

from __future__ import annotations

import pytest
import torch

from llm42 import DVRGenerator, SamplingParams
from llm42.model.weights import random_weights
from llm42.policies import FixedShapePolicy
from llm42.scheduler import InvalidPlanError, Plan, PrefillChunk, SchedulerState, validate_plan
from llm42.verify.canonical_pass import CanonicalPass
from llm42.verify.pass_shapes import SMALLEST_RESULTS, GemmRowBlocks, pass_buckets, result_sizes
from tests.helpers import count_windows, prompt_kv, tiny_config

CFG = tiny_config(max_position_embeddings=256)
WEIGHTS = random_weights(CFG, seed=11)
WINDOW, GROUP = 4, 2  # R = 8
R = WINDOW * GROUP
PROMPTS = [[(7 * i + 3 * j) % (CFG.vocab_size - 3) + 3 for j in range(n)] for i, n in enumerate((61, 5, 23, 40))]


def _generator(max_canonical_tokens: int | None, **kwargs) -> DVRGenerator:
    return DVRGenerator(WEIGHTS, CFG, window=WINDOW, group=GROUP, kv_cache_tokens=1024, block_size=8,
                        max_fast_tokens=64, max_canonical_tokens=max_canonical_tokens, **kwargs)


def _params(i: int, **overrides) -> SamplingParams:
    base = dict(max_new_tokens=10, deterministic=True, ignore_eos=True, seed=100 + i, logprobs=3)
    if i % 2:
        base.update(temperature=0.9, top_k=20)
    return SamplingParams(**{**base, **overrides})


def _outputs(gen: DVRGenerator, prompts=PROMPTS, **overrides):
    completions = gen.generate(prompts, [_params(i, **overrides) for i in range(len(prompts))])
    return [(c.token_ids, c.logprobs, c.top_logprobs) for c in completions]


def test_the_default_is_max_fast_tokens_rounded_down_to_a_multiple_of_r():
    gen = _generator(None)
    assert gen.max_canonical_tokens == 64 and gen.verifier.max_rows == 64
    assert gen.verifier.canonical_pass.buckets == (8, 16, 24, 32, 40, 48, 56, 64)  # no graphs: every multiple
    assert DVRGenerator(WEIGHTS, CFG, window=WINDOW, group=GROUP, kv_cache_tokens=1024,
                        max_fast_tokens=5).max_canonical_tokens == R
    assert pass_buckets(8, 40) == (8, 16, 32, 40)  # with CUDA graphs: one graph per bucket
    assert pass_buckets(8, 40, is_graphed=False) == (8, 16, 24, 32, 40)


def test_bad_max_canonical_tokens_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="max_canonical_tokens .*multiple of R"):
        _generator(20)
    with pytest.raises(TypeError, match="max_canonical_tokens must be an int"):
        _generator(True)
    with pytest.raises(ValueError, match="max_canonical_tokens must be a positive integer"):
        _generator(0)


def test_wide_passes_commit_the_narrow_passes_bits():
    narrow, wide = _generator(R), _generator(8 * R)
    assert _outputs(wide) == _outputs(narrow)
    # the wide generator did run passes of more than R rows, and fewer of them
    assert wide.stats["canonical_passes"] < narrow.stats["canonical_passes"]
    assert wide.stats["canonical_rows"] > R * wide.stats["canonical_passes"] - R
    for prompt in PROMPTS:
        if len(prompt) > R:
            for a, b in zip(prompt_kv(wide, prompt), prompt_kv(narrow, prompt)):
                assert torch.equal(a, b)


SHORT_PROMPTS = [[(5 * i + 7 * j) % (CFG.vocab_size - 3) + 3 for j in range(3 + i % 4)] for i in range(12)]


def test_wide_passes_verify_more_than_g_windows_with_the_narrow_passes_bits():
    """With ``wide_verify=True`` windows fill a wide pass too (its head and sampler on blocks of R result rows):
    G per R rows. Off (the default), a pass holds at most G windows however wide it may be."""
    narrow, default, wide = _generator(R), _generator(8 * R), _generator(8 * R, wide_verify=True)
    counts = {name: count_windows(gen) for name, gen in
              (("narrow", narrow), ("default", default), ("wide", wide))}
    reference = _outputs(narrow, SHORT_PROMPTS, max_new_tokens=24)
    assert _outputs(wide, SHORT_PROMPTS, max_new_tokens=24) == reference
    assert _outputs(default, SHORT_PROMPTS, max_new_tokens=24) == reference
    assert max(counts["narrow"]) <= GROUP and max(counts["default"]) <= GROUP < max(counts["wide"])
    assert wide.stats["canonical_passes"] < narrow.stats["canonical_passes"]


def test_negative_control_a_wide_verify_pass_without_r_row_blocks_changes_the_bits(monkeypatch):
    def policy_gen(tokens):
        return _generator(tokens, canonical_policy=_RowsOfMPolicy(), wide_verify=True)

    reference = _outputs(policy_gen(R), SHORT_PROMPTS, max_new_tokens=12)
    wide = policy_gen(8 * R)
    counts = count_windows(wide)
    assert _outputs(wide, SHORT_PROMPTS, max_new_tokens=12) == reference
    assert max(counts) > GROUP
    monkeypatch.setattr(GemmRowBlocks, "linear", lambda self, x, weight, bias=None:
                        self._policy.linear(x, weight, bias))  # GEMMs (the head's too) at M = the bucket
    assert _outputs(policy_gen(8 * R), SHORT_PROMPTS, max_new_tokens=12) != reference


def test_wide_passes_next_to_free_requests_and_alone_agree():
    alone = [(c.token_ids, c.logprobs, c.top_logprobs) for c in
             (_generator(8 * R).generate([p], _params(i))[0] for i, p in enumerate(PROMPTS[:2]))]
    gen = _generator(8 * R)
    free = [gen.submit(list(range(3, 3 + 30)), SamplingParams(max_new_tokens=20, ignore_eos=True))
            for _ in range(3)]
    rids = [gen.submit(p, _params(i)) for i, p in enumerate(PROMPTS[:2])]
    while gen.has_unfinished():
        gen.step()
    for rid in free:
        gen.result(rid)
    batched = [(c.token_ids, c.logprobs, c.top_logprobs) for c in (gen.result(r) for r in rids)]
    assert batched == alone


def test_score_of_a_widely_prefilled_request_equals_its_committed_logprobs():
    gen = _generator(8 * R)
    prompt = PROMPTS[0]
    completion = gen.generate([prompt], _params(0, logprobs=True))[0]
    assert gen.score([prompt], [completion.token_ids])[0] == completion.logprobs


def test_a_worker_thread_runs_wide_passes_with_the_same_bits():
    assert _outputs(_generator(8 * R, canonical_thread=True)) == _outputs(_generator(R))


class _RowsOfMPolicy(FixedShapePolicy):
    """A canonical policy whose GEMM rows depend on M (as a library GEMM's may): + M * 2^-10."""

    def linear(self, x, weight, bias=None):
        return super().linear(x, weight, bias) + x.shape[0] * 2.0 ** -10


def test_negative_control_gemms_at_the_pass_width_would_change_the_bits(monkeypatch):
    def policy_gen(tokens):
        return _generator(tokens, canonical_policy=_RowsOfMPolicy())

    reference = _outputs(policy_gen(R), PROMPTS[:1], max_new_tokens=4)
    assert _outputs(policy_gen(8 * R), PROMPTS[:1], max_new_tokens=4) == reference  # R-row blocks: same bits
    monkeypatch.setattr(GemmRowBlocks, "linear", lambda self, x, weight, bias=None:
                        self._policy.linear(x, weight, bias))  # GEMMs at M = the bucket instead
    assert _outputs(policy_gen(8 * R), PROMPTS[:1], max_new_tokens=4) != reference


def test_a_pass_refuses_more_rows_or_more_wanted_rows_than_it_takes():
    cp = CanonicalPass(WEIGHTS, CFG, FixedShapePolicy(), R, max_rows=2 * R, use_graph=False)
    with pytest.raises(ValueError, match="multiple of R"):
        CanonicalPass(WEIGHTS, CFG, FixedShapePolicy(), R, max_rows=R + 1, use_graph=False)
    gen = _generator(2 * R)
    rid = gen.submit(PROMPTS[0], _params(0))
    gen._admit()
    from llm42.runner import Segment

    seg = Segment(rid, tuple(PROMPTS[0][: 2 * R + 1]), 0, _params(0), 1)
    gen.kv.append(rid, seg.end)
    with pytest.raises(ValueError, match="more than its 16"):
        cp.stage([seg], gen.kv)
    seg = Segment(rid, tuple(PROMPTS[0][: 2 * R - 1]), 0, _params(0), 1)
    cp.stage([seg], gen.kv, wanted=list(range(R + 1)))  # results for more than R rows: two blocks of R
    assert cp._results == 2 * R
    with pytest.raises(ValueError, match="distinct rows among its 15 real rows"):
        cp.stage([seg], gen.kv, wanted=list(range(2 * R)))
    with pytest.raises(ValueError, match="distinct rows"):
        cp.stage([seg], gen.kv, wanted=[0, 0])
    with pytest.raises(ValueError, match="takes no wanted rows"):
        cp.launch([Segment(rid, tuple(PROMPTS[0][:R]), 0, _params(0), 1)], gen.kv, None, targets=[3], wanted=[0])


def _view(rid: int, prompt: int, *, prefilled: int = 0, candidates: int = 0, generated: int = 0):
    from llm42.scheduler import RequestView

    return RequestView(rid, True, prompt, prefilled, generated, candidates, 0, rid)


def test_validate_plan_bounds_a_wide_pass_by_its_rows_and_its_results():
    views = (_view(0, 100), _view(1, 100), _view(2, 10, prefilled=10, generated=1, candidates=R - 1))
    state = SchedulerState(views, WINDOW, GROUP, 64, 0, 4 * R)
    validate_plan(Plan(canonical_prefill=(PrefillChunk(0, 4 * R),)), state)
    with pytest.raises(InvalidPlanError, match="over max_canonical_tokens = 32"):
        validate_plan(Plan(canonical_prefill=(PrefillChunk(0, 4 * R + 1),)), state)
    with pytest.raises(InvalidPlanError, match="results for 10 rows"):
        validate_plan(Plan(verify=(2,), canonical_prefill=(PrefillChunk(0, 10), PrefillChunk(1, 10))), state)
    narrow = SchedulerState(views, WINDOW, GROUP, 64, 0)
    with pytest.raises(InvalidPlanError, match="over R = 8"):
        validate_plan(Plan(canonical_prefill=(PrefillChunk(0, R + 1),)), narrow)


class _RecordingPolicy:
    """A policy stub that records the rows each GEMM call got."""

    def __init__(self, *, has_row_parallel: bool):
        self.rows_seen: list[int] = []
        if has_row_parallel:
            self.row_parallel_linear = self._row_parallel

    def linear(self, x, weight, bias=None):
        self.rows_seen.append(x.shape[0])
        out = x @ weight.T
        return out if bias is None else out + bias

    def _row_parallel(self, x, weight, bias, *, tp, shard):
        return tp.all_reduce_sum(self.linear(x, weight)) + (0 if bias is None else bias)


class _OneRank:
    @staticmethod
    def all_reduce_sum(x):
        return x * 2  # stands for the sum over two ranks holding the same partial product


@pytest.mark.parametrize("has_row_parallel", [True, False])
def test_gemm_row_blocks_hands_every_gemm_r_rows_tensor_parallel_too(has_row_parallel):
    policy = _RecordingPolicy(has_row_parallel=has_row_parallel)
    blocks = GemmRowBlocks(policy, R)
    x, w, b = torch.randn(4 * R, 6), torch.randn(5, 6), torch.randn(5)
    assert torch.equal(blocks.linear(x, w, b), torch.cat([x[i: i + R] @ w.T + b for i in range(0, 4 * R, R)]))
    assert torch.equal(blocks.row_parallel_linear(x, w, b, tp=_OneRank(), shard=None),
                       torch.cat([(x[i: i + R] @ w.T) * 2 + b for i in range(0, 4 * R, R)]))
    assert set(policy.rows_seen) == {R}


class _RecordingGemmPolicy(FixedShapePolicy):
    """``FixedShapePolicy(gemm=...)`` that records the rows of every GEMM it runs."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.rows_seen: list[int] = []

    def linear(self, x, weight, bias=None):
        self.rows_seen.append(x.shape[0])
        return super().linear(x, weight, bias)


def test_a_row_invariant_gemm_runs_each_wide_gemm_once_with_the_narrow_passes_bits():
    """``FixedShapePolicy(gemm="triton")`` says its GEMM rows are their own at any M (on the CPU both configs run
    the exact GEMM), so a wide pass hands each GEMM all its rows at once instead of R-row blocks; the bits are
    those of R-row passes and of the cuBLAS config (the same exact GEMM here). Control: with ``gemm="cublas"``
    no GEMM sees more than R rows, so the first half is not vacuous."""
    triton, cublas = _RecordingGemmPolicy(gemm="triton"), _RecordingGemmPolicy(gemm="cublas")
    assert triton.is_gemm_row_invariant and not cublas.is_gemm_row_invariant
    wide = _generator(8 * R, canonical_policy=triton)
    got = _outputs(wide)
    assert not any(isinstance(p, GemmRowBlocks) for p in wide.verifier.canonical_pass._policies.values())
    assert max(triton.rows_seen) > R, "no GEMM of a wide pass ran over more than R rows"
    assert got == _outputs(_generator(R, canonical_policy=FixedShapePolicy(gemm="triton")))
    assert got == _outputs(_generator(8 * R, canonical_policy=cublas))
    assert max(cublas.rows_seen) <= R
    for prompt in PROMPTS:
        if len(prompt) > R:
            other = _generator(R)
            other.generate([prompt], _params(0))
            for a, b in zip(prompt_kv(wide, prompt), prompt_kv(other, prompt)):
                assert torch.equal(a, b)


def test_result_sizes_go_below_r_only_for_a_row_invariant_head():
    assert result_sizes(2048, 2048) == (2048,)
    assert result_sizes(2048, 2048, is_row_invariant=True) == (8, 64, 512, 2048)
    assert result_sizes(256, 2048, is_row_invariant=True) == (8, 64, 256, 512, 1024, 2048)
    assert result_sizes(8, 32, is_graphed=False, is_row_invariant=True) == (8, 16, 24, 32)


class _ScaledByMPolicy(FixedShapePolicy):
    """A canonical policy whose GEMM rows depend on M: x (1 + M * 2^-8) (not a shift, which a log-softmax hides)."""

    def linear(self, x, weight, bias=None):
        return super().linear(x, weight, bias) * (1 + x.shape[0] * 2.0 ** -8)


class _ScaledByMClaimingInvariance(_ScaledByMPolicy):
    """The same, claiming its rows are their own at any M (``is_gemm_row_invariant``)."""

    is_gemm_row_invariant = True


@pytest.mark.parametrize("max_tokens", [1, 4])
def test_a_row_invariant_head_runs_on_the_wanted_rows_only_with_the_same_bits(max_tokens):
    """With R = 32 a pass whose policy's GEMM rows are their own at any M (``gemm="triton"``; on the CPU the exact
    GEMM) runs its output head and sampler on 8 rows where it wants fewer (a prompt chunk's last row, one short
    window), in narrow and wide passes: tokens, log-probs, top alternatives and the prompts' canonical K/V equal
    those of the cuBLAS config's passes, whose head runs on R rows. Negative control: a policy whose GEMM rows move
    with M but claims they do not commits other bits (so the comparison sees a head run on fewer rows)."""
    def gen(policy, tokens):
        return DVRGenerator(WEIGHTS, CFG, window=8, group=4, kv_cache_tokens=2048, block_size=8, max_fast_tokens=128,
                            max_canonical_tokens=tokens, canonical_policy=policy)

    prompts = [p * 2 for p in PROMPTS]  # 122, 10, 46 and 80 tokens: chunks of one and several passes
    reference = _outputs(gen(_RecordingGemmPolicy(gemm="cublas"), 32), prompts, max_new_tokens=max_tokens)
    for tokens in (32, 128):
        triton = _RecordingGemmPolicy(gemm="triton")
        small = gen(triton, tokens)
        assert _outputs(small, prompts, max_new_tokens=max_tokens) == reference
        assert SMALLEST_RESULTS in triton.rows_seen, "no head ran on fewer than R rows"
        other = gen(FixedShapePolicy(), 32)
        other.generate([prompts[0]], _params(0, max_new_tokens=max_tokens))
        for a, b in zip(prompt_kv(small, prompts[0]), prompt_kv(other, prompts[0])):
            assert torch.equal(a, b)
    honest = _outputs(gen(_ScaledByMPolicy(), 32), prompts, max_new_tokens=max_tokens)
    assert _outputs(gen(_ScaledByMClaimingInvariance(), 32), prompts, max_new_tokens=max_tokens) != honest


def test_bad_canonical_gemm_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="gemm"):
        FixedShapePolicy(gemm="cutlass")
    assert repr(FixedShapePolicy(gemm="triton")) == "FixedShapePolicy(key_block=64, gemm='triton')"
    assert repr(FixedShapePolicy()) == "FixedShapePolicy(key_block=64)"
