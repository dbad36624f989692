"""Chained prompt passes: a deterministic prompt's next chunk launched while its previous chunk's pass is in flight.

On CUDA a pass's staging waits on the device (``CanonicalPass.chains``), so the engine launches the next chunk of a
long deterministic prompt behind the pass in flight instead of waiting for it on the host (``CanonicalPasses.chained``,
``llm42.engine.passes``). On the CPU a pass is finished when ``launch`` returns; the test wraps the verifier so
that a pass reports "not ready" until its first ``is_ready`` polls have gone by (``lag_passes``), and lets the engine chain. What it
checks is the engine's bookkeeping: where each chunk starts, the passes a request is in, the commits applied in
launch order, a chunk's K/V left standing when the chunk before it commits. The GPU side (pinned results used in
turn, staging behind the pass) is ``tests/gpu/test_chained_prefill_cuda.py``.
"""

from __future__ import annotations


from llm42 import DVRGenerator, SamplingParams
from llm42.model.weights import random_weights
from tests.helpers import lag_passes, record_launches, serve, tiny_config

CFG = tiny_config(max_position_embeddings=256)
WEIGHTS = random_weights(CFG, seed=11)


def _generator(*, chained: bool, polls: int = 5) -> tuple[DVRGenerator, list[int]]:
    gen = DVRGenerator(WEIGHTS, CFG, window=4, group=2, kv_cache_tokens=1024, block_size=8, max_fast_tokens=16,
                       max_canonical_tokens=16)
    launches_behind = []  # per launch: 1 if another pass was in flight then
    if chained:
        lag_passes(gen, polls)
        launches_behind = record_launches(gen, lambda work: int(gen.passes.oldest is not None))
        gen._pool.chain_prefill = True  # what a verifier whose passes wait on the device says (chains)
    return gen, launches_behind


def _run(gen: DVRGenerator, prompts, params_list) -> dict:
    return {c.request_id: (c.token_ids, c.logprobs) for c in serve(gen, prompts, params_list)}


def _case():
    prompts = [[(7 * i + 3 * j) % 120 + 3 for j in range(n)] for i, n in enumerate((61, 45, 12, 70))]
    params = [SamplingParams(max_new_tokens=6, deterministic=True, ignore_eos=True, temperature=0.8, seed=3),
              SamplingParams(max_new_tokens=5, deterministic=True, ignore_eos=True),
              SamplingParams(max_new_tokens=8, ignore_eos=True),  # a free request beside them
              SamplingParams(max_new_tokens=4, deterministic=True, ignore_eos=True, logprobs=2)]
    return prompts, params


def test_chained_prompt_chunks_commit_what_unchained_passes_commit():
    prompts, params = _case()
    reference = _run(_generator(chained=False)[0], prompts, params)
    gen, behind = _generator(chained=True)
    chained = _run(gen, prompts, params)
    assert sum(behind) >= 4, f"only {sum(behind)} of {len(behind)} passes were launched behind another"  # not vacuous
    det = [rid for rid, p in zip(reference, params) if p.deterministic]
    assert [chained[rid] for rid in det] == [reference[rid] for rid in det]
    assert all(len(reference[rid][0]) == p.max_new_tokens for rid, p in zip(reference, params))


def test_a_chunk_whose_kv_is_truncated_when_the_chunk_before_commits_is_caught():
    """Negative control: the verifier rolls a committed chunk's request back to that chunk's end (what it did
    for every commit before chaining), dropping the chained chunk's K/V: the run must not pass as equal."""
    prompts, params = _case()
    reference = _run(_generator(chained=False)[0], prompts, params)
    gen, behind = _generator(chained=True)
    finish = gen.verifier.finish

    def truncating_finish(launched, kv, **kwargs):
        commits = finish(launched, kv, **kwargs)
        for w, commit in zip(launched.work, commits):
            if w.is_prefill:
                kv.truncate(w.segment.rid, commit.num_kv_valid)
        return commits

    gen.verifier.finish = truncating_finish
    try:
        chained = _run(gen, prompts, params)
    except ValueError:  # the engine refuses to mark K/V it no longer holds: caught as surely as other tokens
        return
    det = [rid for rid, p in zip(reference, params) if p.deterministic]
    assert sum(behind) >= 4
    assert [chained[rid] for rid in det] != [reference[rid] for rid in det]
