"""Drafting from a fast run of deterministic prompts (``prompt_drafts``) on CUDA: the fast steps write a prompt's
K/V on their stream while the canonical passes of its earlier chunks run on theirs, and every committed bit stays
what the default commits.

Each canonical pass is held back on the device (``torch.cuda._sleep`` queued on its stream ahead of it), so the
fast path runs the prompts, and drafts from them, while their passes wait: the case where a fast K/V write could
land where a canonical pass reads. Negative control: a prompt's fast run going on over positions the canonical
passes have (``RequestPool.prompts_to_draft`` without its rule) commits other bits.
"""

from __future__ import annotations

import random

import pytest

pytest.importorskip("triton")

from llm42.engine.requests import RequestPool  # noqa: E402
from llm42.params import SamplingParams  # noqa: E402
from tests.gpu.test_chained_prefill_cuda import _hold_passes  # noqa: E402
from tests.gpu.test_engine_cuda import make_generator, random_prompt  # noqa: E402
from tests.helpers import prompts_to_draft_without_rule  # noqa: E402

pytestmark = pytest.mark.gpu


def _case(cfg):
    rng = random.Random(31)
    lengths = [rng.randint(300, 1400) if i % 2 == 0 else rng.randint(10, 200) for i in range(12)]
    prompts = [random_prompt(rng, cfg.vocab_size, n) for n in lengths]
    params = [SamplingParams(max_new_tokens=rng.randint(20, 60), deterministic=i % 3 != 2, logprobs=True,
                             ignore_eos=True, temperature=0.8 if i % 2 else 0.0, seed=200 + i) for i in range(12)]
    return prompts, params


def _run(llama8b, *, max_fast_tokens: int = 1024, **kwargs):
    """The deterministic requests' outputs, the engine's stats, and the most drafts a deterministic request held
    while its prompt's canonical prefill had not committed."""
    cfg, _ = llama8b
    prompts, params = _case(cfg)
    gen = make_generator(llama8b, max_canonical_tokens=512, max_fast_tokens=max_fast_tokens, **kwargs)
    _hold_passes(gen, lambda work: None)
    rids = [gen.submit(p, q) for p, q in zip(prompts, params)]
    most = 0
    while gen.has_unfinished():
        gen.step()
        for req in gen._pool.running.values():
            if req.is_deterministic and req.is_prefill:
                most = max(most, len(req.candidates) + req.num_live_pending)
    outputs = []
    for rid, q in zip(rids, params):
        c = gen.result(rid)
        if q.deterministic:
            outputs.append((tuple(c.token_ids), tuple(c.logprobs)))
    stats = dict(gen.stats)
    gen.close()
    return outputs, stats, most


def test_prompt_drafts_commit_the_default_bits_beside_held_back_passes(llama8b, report, monkeypatch):
    reference, _, most_off = _run(llama8b)
    drafted, stats, most_on = _run(llama8b, prompt_drafts=True)
    report("prompt_drafts_cuda", {"prompt_draft_tokens": stats["prompt_draft_tokens"],
                                  "ahead_tokens_kept": stats["ahead_tokens_kept"],
                                  "ahead_tokens_dropped": stats["ahead_tokens_dropped"],
                                  "most_drafts_while_prefilling": most_on})
    assert most_off == 0
    assert stats["prompt_draft_tokens"] > 0 and most_on > 1, (stats, most_on)  # not vacuous
    assert drafted == reference
    # negative control: fast K/V written where a canonical pass has the position
    # (few fast rows: the canonical passes overtake the fast runs of the long prompts)
    monkeypatch.setattr(RequestPool, "prompts_to_draft", prompts_to_draft_without_rule)
    unsafe, _, _ = _run(llama8b, prompt_drafts=True, max_fast_tokens=64)
    assert unsafe != reference, "fast K/V writes over canonical prompt positions went unnoticed"
