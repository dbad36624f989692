"""Chained verify passes and eager verification (``DVRGenerator(chain_passes=)``, ``DefaultScheduler(eager_verify=)``).

With ``chain_passes="all"`` any plan whose requests are in no pass goes behind the pass in flight
instead of waiting for it: its windows are other requests' (the scheduler never sees a request in a pass, bar a
long prompt's next chunk), so nothing it reads is written by the pass ahead of it. On the CPU a pass is finished
when ``launch`` returns; the tests hold each pass "not ready" for a few polls (``lag_passes``) and let the engine
chain, as ``tests/test_chained_prefill.py`` does for prompt chunks. The committed output must be the unchained
engine's and the batch-size-1 reference's; the negative control lets a chained pass's results land in the rows of
the pass ahead of it (one result set for both, what two pinned sets in turn prevent on CUDA) and must be caught.
"""

from __future__ import annotations

import pytest

from llm42 import DVRGenerator, SamplingParams, SchedulerState
from llm42.model.weights import random_weights
from llm42.policies import NoisyFastPolicy
from llm42.scheduler import DefaultScheduler, RequestView, validate_plan
from llm42.testing import strategies as ls
from tests.helpers import lag_passes, record_launches, serve

CFG = ls.wide_model_config(vocab_size=256, max_position_embeddings=128)  # CPU GEMMs drift with the batch here
WEIGHTS = random_weights(CFG, seed=5)
WINDOW, GROUP = 4, 2


def _generator(*, chain: str, lag: int = 0, eager: bool = False, noisy: bool = True, **kwargs) -> DVRGenerator:
    # lag_passes counts a pass's readiness in asks: apply_before_read (the default since round 39) asks twice a step,
    # so its passes would be "in flight" half as long and chain half as often; these tests fix the asks per step
    kwargs.setdefault("apply_before_read", False)
    gen = DVRGenerator(WEIGHTS, CFG, window=WINDOW, group=GROUP, kv_cache_tokens=2048, block_size=8,
                       max_fast_tokens=32, chain_passes=chain, scheduler=DefaultScheduler(eager_verify=eager),
                       fast_policy=NoisyFastPolicy(scale=0.5, seed=3) if noisy else None, **kwargs)
    if lag:
        lag_passes(gen, lag)
        gen._pool.chain_prefill = chain != "off"  # what a verifier whose passes wait on the device says (chains)
    return gen


def _count_launches(gen: DVRGenerator) -> list[tuple[int, int]]:
    """Per launch: (1 if another pass was in flight then, the number of verify windows in it)."""
    return record_launches(gen, lambda work: (int(gen.passes.oldest is not None),
                                              sum(not w.is_prefill for w in work)))


def _case():
    prompts = [[(11 * i + 5 * j) % 200 + 3 for j in range(n)] for i, n in enumerate((9, 14, 6, 11, 8, 5))]
    params = [SamplingParams(max_new_tokens=n, deterministic=det, ignore_eos=True, temperature=t, seed=7 + i,
                             logprobs=det)
              for i, (n, det, t) in enumerate(((14, True, 0.0), (11, True, 0.9), (9, False, 0.0),
                                               (16, True, 0.7), (12, True, 0.0), (10, False, 0.8)))]
    return prompts, params


def _run(gen: DVRGenerator, prompts, params) -> dict:
    """The deterministic requests' (tokens, log-probs) by request id; every request ran to its length."""
    out = {}
    for c, sp in zip(serve(gen, prompts, params, max_steps=3000), params):
        assert len(c.token_ids) == sp.max_new_tokens
        if sp.deterministic:
            out[c.request_id] = (c.token_ids, c.logprobs)
    return out


def _alone(prompts, params) -> dict:
    """The batch-size-1 reference: each deterministic request alone in a fresh generator, no chaining."""
    out = {}
    for rid, (p, sp) in enumerate(zip(prompts, params)):
        if sp.deterministic:
            out[rid] = _run(_generator(chain="off", noisy=False), [p], [sp])[0]
    return out


# (apply_before_read, lag in asks): the order these tests pin, and the default order, which asks twice a step, with
# twice the asks (round 40: the default's chaining on the CPU too)
ORDERS = {"apply_after_read": (False, 5), "apply_before_read": (True, 10)}


@pytest.mark.parametrize("order", list(ORDERS))
def test_chained_verify_passes_commit_the_reference_bits(order):
    apply_before_read, lag = ORDERS[order]
    prompts, params = _case()
    gen = _generator(chain="all", lag=lag, apply_before_read=apply_before_read)
    launches = _count_launches(gen)
    chained = _run(gen, prompts, params)
    behind_with_windows = sum(1 for behind, windows in launches if behind and windows)
    assert behind_with_windows >= 8, f"only {behind_with_windows} of {len(launches)} passes chained windows"
    assert gen.stats["rollbacks"] > 0  # the noisy fast path makes windows roll back: not vacuous
    assert list(chained.values()) == list(_alone(prompts, params).values())
    unchained = _run(_generator(chain="off", lag=lag, apply_before_read=apply_before_read), prompts, params)
    assert chained == unchained


def test_prompts_mode_chains_no_windows():
    prompts, params = _case()
    gen = _generator(chain="prompts", lag=5)
    launches = _count_launches(gen)
    _run(gen, prompts, params)
    assert not any(behind and windows for behind, windows in launches)


def test_a_chained_pass_whose_results_overwrite_the_pass_ahead_is_caught():
    """Negative control: one result set for both passes in flight (the chained pass's rows written over the rows
    of the pass ahead, before the engine reads them): the committed output must differ from the reference, or the
    engine must refuse it."""
    prompts, params = _case()
    reference = _alone(prompts, params)
    gen = _generator(chain="all", lag=5)
    launch = gen.verifier.launch
    num_clobbered = 0

    def clobbering(work, kv):
        nonlocal num_clobbered
        ahead = gen.passes.oldest
        launched = launch(work, kv)
        if ahead is not None:
            for name in ("_tokens", "_logprobs"):  # the result rows, as a single pinned set would hold them
                mine, theirs = getattr(launched.result, name), getattr(ahead.result, name)
                n = min(mine.shape[0], theirs.shape[0])
                theirs[:n] = mine[:n]
            num_clobbered += 1
        return launched

    gen.verifier.launch = clobbering
    try:
        out = _run(gen, prompts, params)
    except (ValueError, IndexError, RuntimeError):
        return
    assert num_clobbered >= 3
    assert list(out.values()) != list(reference.values())


def test_a_bad_chain_passes_is_refused_naming_it():
    with pytest.raises(ValueError, match="chain_passes"):
        DVRGenerator(WEIGHTS, CFG, chain_passes="sometimes")
    with pytest.raises(ValueError, match="chain_passes"):
        DVRGenerator(WEIGHTS, CFG, chain_passes=True)


# -- eager verification ---------------------------------------------------------------------------------------------

def _view(rid: int, *, candidates: int, deterministic: bool = True) -> RequestView:
    return RequestView(rid=rid, is_deterministic=deterministic, num_prompt_tokens=5, num_prefilled=5,
                       num_generated=1, num_candidates=candidates if deterministic else 0,
                       num_speculable=(WINDOW - 1 - candidates) if deterministic else 0, arrival=rid)


def _state(views, *, in_flight: int = 0) -> SchedulerState:
    return SchedulerState(tuple(views), WINDOW, GROUP, 64, 0, num_passes_in_flight=in_flight)


def test_eager_verify_takes_partial_windows_only_while_no_pass_is_in_flight():
    views = [_view(0, candidates=1), _view(1, candidates=2), _view(2, candidates=0, deterministic=False)]
    eager = DefaultScheduler(eager_verify=True)
    idle = _state(views)
    plan = eager.schedule(idle)
    validate_plan(plan, idle)
    assert plan.verify == (0, 1) and plan.fast_decode == (2,)
    assert eager.schedule(_state(views, in_flight=1)).verify == ()  # the stream is busy: wait for full windows
    assert DefaultScheduler().schedule(idle).verify == ()  # off by default


def test_eager_verify_waits_when_the_drafting_requests_do_not_fit_one_pass():
    crowd = [_view(r, candidates=1) for r in range(GROUP + 1)]  # more than G windows: not one R-row pass
    assert DefaultScheduler(eager_verify=True).schedule(_state(crowd)).verify == ()


def test_eager_verify_commits_the_reference_bits_and_throws_away_fewer_drafts():
    """On the CPU every pass is finished at launch, so the stream is idle at each step: eager verification checks
    the drafts of the (at most G) deterministic requests every step, and a rollback loses fewer of them."""
    prompts, params = _case()
    eager_gen = DVRGenerator(WEIGHTS, CFG, window=8, group=4, kv_cache_tokens=2048, block_size=8,
                             max_fast_tokens=32, scheduler=DefaultScheduler(eager_verify=True),
                             fast_policy=NoisyFastPolicy(scale=0.5, seed=3))
    lazy_gen = DVRGenerator(WEIGHTS, CFG, window=8, group=4, kv_cache_tokens=2048, block_size=8,
                            max_fast_tokens=32, fast_policy=NoisyFastPolicy(scale=0.5, seed=3))
    eager = _run(eager_gen, prompts, params)
    lazy = _run(lazy_gen, prompts, params)
    assert eager == lazy  # the same committed bits, whenever the windows were verified
    assert lazy_gen.stats["rollbacks"] > 0
    assert eager_gen.stats["recomputed_tokens"] < lazy_gen.stats["recomputed_tokens"]
