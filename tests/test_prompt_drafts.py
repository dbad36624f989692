"""Drafting from a fast run of a deterministic prompt (``DVRGenerator(prompt_drafts=True)``).

A deterministic request's prompt is prefilled by canonical passes; until the pass of its last chunk commits, the
request cannot draft. With ``prompt_drafts`` the fast path also runs the prompt, in the fast step's spare rows, and
the request drafts from it: its first draft guesses the token the last chunk's pass commits. The canonical
prefill is unchanged, so the committed output must be too. What could break it is a fast K/V write landing where
a canonical pass wrote (or will have written first): the fast path runs a prompt position only while no canonical
pass has it. The negative control drops that rule and commits other bits.

Passes are made to lag (``lag_passes``) as on a busy GPU, so that prompts wait for their passes while the fast
steps go on.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm42 import DVRGenerator, SamplingParams
from llm42.engine.requests import RequestPool
from llm42.model.weights import random_weights
from llm42.policies import NoisyFastPolicy
from llm42.testing.strategies import batch_mixes
from llm42.verify.verifier import Verifier
from tests.helpers import lag_passes, prompts_to_draft_without_rule, run_dvr_ab, tiny_config
from tests.test_draft_ahead import PARAMS as DRAFT_AHEAD_PARAMS

CFG = tiny_config(max_position_embeddings=256)
WEIGHTS = random_weights(CFG, seed=3)
WINDOW, GROUP = 4, 2  # R = 8: a 20-token prompt takes three passes
PROMPTS = [[5, 9, 14, 3] * 5, [7, 7, 8], [100, 101, 102, 103, 104] * 3, [40, 41] * 7, [11, 12, 13] * 4,
           [60, 61, 62, 63, 64, 65, 66, 67, 68]]
PARAMS = [*DRAFT_AHEAD_PARAMS,  # three deterministic requests (greedy, sampled, top-k) and two free ones
          SamplingParams(max_new_tokens=2, deterministic=True, logprobs=True, ignore_eos=True)]  # too short to draft
DETERMINISTIC = [i for i, p in enumerate(PARAMS) if p.deterministic]
# prompt rows the fast path runs for the requests that draft from their prompts (not the 2-token one)
DRAFTED_PROMPT_ROWS = sum(len(PROMPTS[i]) for i in DETERMINISTIC if PARAMS[i].max_new_tokens > 2)


def make(*, lag: int = 0, **kwargs) -> DVRGenerator:
    kwargs.setdefault("max_canonical_tokens", WINDOW * GROUP)
    return lag_passes(DVRGenerator(WEIGHTS, CFG, window=WINDOW, group=GROUP, kv_cache_tokens=4096, block_size=8,
                                   **kwargs), lag)


def deterministic_outputs(gen: DVRGenerator, prompts=PROMPTS, params=PARAMS) -> list[tuple[list[int], list[float]]]:
    completions = gen.generate(prompts, params)
    return [(completions[i].token_ids, completions[i].logprobs) for i, p in enumerate(params) if p.deterministic]


@pytest.fixture(scope="module")
def reference() -> list[tuple[list[int], list[float]]]:
    """Each deterministic request alone, without prompt drafts: the contract's batch-size-1 reference."""
    return [deterministic_outputs(make(), [PROMPTS[i]], [PARAMS[i]])[0] for i in DETERMINISTIC]


def _run(gen: DVRGenerator) -> tuple[int, list[int]]:
    """Submits the requests and steps ``gen`` through them; returns the most drafts any deterministic request held
    (read back or in flight) while its prompt's canonical prefill had not committed, and the step in which each
    deterministic request finished."""
    rids = [gen.submit(prompt, params) for prompt, params in zip(PROMPTS, PARAMS)]
    most, steps, finished = 0, 0, {}
    while gen.has_unfinished():
        gen.step()
        steps += 1
        for req in gen._pool.running.values():
            if req.is_deterministic and req.is_prefill:
                most = max(most, len(req.candidates) + req.num_live_pending)
        finished.update({i: steps for i in DETERMINISTIC if i not in finished and gen.is_finished(rids[i])})
    return most, [finished[i] for i in DETERMINISTIC]


@pytest.mark.parametrize("lag", [0, 2, 4])
@pytest.mark.parametrize("noisy", [False, True])
def test_prompt_drafts_commit_the_reference_outputs(reference, lag, noisy):
    policy = NoisyFastPolicy(scale=64.0, seed=1) if noisy else None
    gen = make(lag=lag, prompt_drafts=True, fast_policy=policy)
    assert deterministic_outputs(gen) == reference
    # not vacuous: every prompt that may draft ran through the fast path (the 2-token request's did not)
    assert gen.stats["prompt_draft_tokens"] == DRAFTED_PROMPT_ROWS, gen.stats
    if noisy:  # the noise makes the first drafts miss: they are dropped, nothing of them committed
        assert gen.stats["ahead_tokens_dropped"] > 0, gen.stats
    else:
        assert gen.stats["ahead_tokens_kept"] > 0, gen.stats


@pytest.mark.parametrize("lag", [2, 3])
def test_requests_draft_before_their_prompts_commit_and_finish_sooner(lag):
    drafts_on, done_on = _run(make(lag=lag, prompt_drafts=True))
    drafts_off, done_off = _run(make(lag=lag))
    assert drafts_on > 1  # the first draft and drafts after it, before the prompt committed
    assert drafts_off == 0
    # what it is for: the deterministic requests finish in fewer steps (here each one's prompt passes also share
    # the few rows of R = 8 with windows that fall due sooner, so a prompt may commit a step later)
    assert sum(done_on) < sum(done_off), (done_on, done_off)


def test_prompt_drafts_on_a_cached_prefix_and_on_the_canonical_thread(reference):
    gen = make(lag=1, prompt_drafts=True)
    assert deterministic_outputs(gen) == reference
    cached = gen.stats["prefix_cached_tokens"]
    assert deterministic_outputs(gen) == reference  # again: the prompts' canonical blocks are cached now
    assert gen.stats["prefix_cached_tokens"] > cached  # not vacuous: the fast run began after a cached prefix
    threaded = make(prompt_drafts=True, canonical_thread=True)
    assert deterministic_outputs(threaded) == reference
    assert threaded.stats["prompt_draft_tokens"] > 0


def test_negative_control_fast_writes_over_canonical_prompt_kv_commit_other_bits(reference, monkeypatch):
    # few spare fast rows: the canonical prefill overtakes the fast run of the prompts
    safe = make(prompt_drafts=True, max_fast_tokens=8)
    assert deterministic_outputs(safe) == reference
    monkeypatch.setattr(RequestPool, "prompts_to_draft", prompts_to_draft_without_rule)
    unsafe = make(prompt_drafts=True, max_fast_tokens=8)
    assert deterministic_outputs(unsafe) != reference


@settings(max_examples=12, deadline=None)
@given(mix=batch_mixes(vocab_size=CFG.vocab_size, max_size=5, max_prompt_len=20, max_new_tokens=10, logprobs=True),
       lag=st.integers(0, 3), noisy=st.booleans(), max_fast_tokens=st.sampled_from([8, 16, 64]))
def test_prompt_drafts_keep_every_mix_bit_exact(mix, lag, noisy, max_fast_tokens):
    prompts, params = [p for p, _ in mix], [q for _, q in mix]
    expected = [deterministic_outputs(make(), [p], [q])[0] for p, q in mix if q.deterministic]
    gen = make(lag=lag, prompt_drafts=True, max_fast_tokens=max_fast_tokens,
               fast_policy=NoisyFastPolicy(scale=8.0, seed=2) if noisy else None)
    assert deterministic_outputs(gen, prompts, params) == expected


def test_prompt_drafts_config_errors_name_the_field():
    with pytest.raises(ValueError, match="prompt_drafts.*draft_ahead"):
        make(prompt_drafts=True, draft_ahead=False)
    with pytest.raises(TypeError, match="prompt_drafts"):
        make(prompt_drafts=1)

    class OwnVerifier:  # a user's verifier (verify() only): the engine cannot draft ahead of its passes
        def verify(self, work, kv):
            raise AssertionError("not reached")

    with pytest.raises(ValueError, match="prompt_drafts"):
        DVRGenerator(WEIGHTS, CFG, window=WINDOW, group=GROUP, kv_cache_tokens=2048, verifier=OwnVerifier(),
                     prompt_drafts=True)
    assert isinstance(make(prompt_drafts=True).verifier, Verifier)


def test_dvr_ab_serves_the_prompt_drafts_variant_with_the_defaults_outputs(tmp_path, monkeypatch):
    """The benchmark's variant (benchmarks/device/dvr_ab.py, run on the H200 next) end to end on the CPU: the same
    deterministic outputs as the default config in its contract check (with longest-output-first service too, round
    32's variant), and prompts run by the fast path."""
    got = run_dvr_ab(tmp_path / "ab.json", monkeypatch, "default,prompt_drafts,order_budget_prompt_drafts",
                     "--num-requests", "4")
    checks = got["deterministic_outputs_identical"]
    assert len(checks) == 2, checks
    for check in checks.values():
        assert check["num_checked"] > 0 and check["num_identical"] == check["num_checked"]
    assert got["variants"]["prompt_drafts"] == {"prompt_drafts": True}
    assert got["variants"]["order_budget_prompt_drafts"] == {"scheduler_order": "budget", "prompt_drafts": True}


def test_the_step_model_benchmark_runs_both_ways_with_the_same_bits():
    """benchmarks/cpu_prompt_drafts.py's run (passes done a fixed number of steps after launch), small."""
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "cpu_prompt_drafts.py"
    spec = importlib.util.spec_from_file_location("cpu_prompt_drafts", script)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    off, on = (bench.run(num_requests=16, share=0.5, lag=2, prompt_drafts=flag) for flag in (False, True))
    assert off["deterministic_digest"] == on["deterministic_digest"]
    assert off["prompt_draft_tokens"] == 0 < on["prompt_draft_tokens"]
    assert on["num_deterministic"] == 8 and on["deterministic_finish_step"]["max"] <= on["steps"]


def test_prompt_drafts_keep_a_step_within_the_prompt_staging_of_its_graphs():
    """Forty short deterministic prompts at once: a step runs no more prompt chunks in all than the fast path's
    prompt staging holds (``FastPrefill.max_seqs``, 32; a step with more would run eagerly on CUDA), and reaches it."""
    gen = make(prompt_drafts=True, max_num_seqs=40, max_fast_tokens=512)
    chunks = []
    launch = gen.fast_step.launch

    def counting(plan, prompt_drafts=()):
        chunks.append(len(plan.fast_prefill) + len(prompt_drafts))
        return launch(plan, prompt_drafts)

    gen.fast_step.launch = counting
    prompts = [[3 + i, 4 + i, 5 + i] for i in range(40)]
    params = [SamplingParams(max_new_tokens=4, deterministic=True, logprobs=True, ignore_eos=True)] * 40
    expected = [deterministic_outputs(make(), [p], [q])[0] for p, q in zip(prompts, params)]
    assert deterministic_outputs(gen, prompts, params) == expected
    assert max(chunks) == gen.fast_step.fast_prefill.max_seqs == 32
