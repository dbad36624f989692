"""Windows closed at a risky draft on CUDA (``DVRGenerator(risk_margin=)``): the decode graphs carry each
deterministic row's draft margin back in place of its fast log-prob, windows end at their first risky draft, and
the committed bits are those of the engine that never closes a window early.

The threshold is taken from the drafts of the run without the cut (their 30th percentile), so that a share of
drafts is risky whatever the random model's logits look like: the test cannot pass with no window cut.
"""

from __future__ import annotations

import random

import pytest

pytest.importorskip("triton")

from llm42.params import SamplingParams  # noqa: E402
from tests.gpu.test_engine_cuda import make_generator, random_prompt  # noqa: E402
from tests.helpers import record_launches, serve  # noqa: E402

pytestmark = pytest.mark.gpu


def _case(vocab: int):
    rng = random.Random(24)
    prompts, params = [], []
    for i in range(24):
        det = i % 3 != 2
        sampled = i % 2 == 1
        prompts.append(random_prompt(rng, vocab, rng.randint(8, 120)))
        params.append(SamplingParams(max_new_tokens=rng.randint(40, 90), deterministic=det, ignore_eos=True,
                                     logprobs=True, temperature=0.8 if sampled else 0.0,
                                     top_p=0.95 if sampled and i % 4 == 1 else 1.0,
                                     seed=1000 + i if sampled else None))
    return prompts, params


def _run(llama8b, risk_margin: float):
    gen = make_generator(llama8b, risk_margin=risk_margin)

    def record(work):
        running = gen._pool.running
        return [list(running[w.segment.rid].candidate_margins[: len(w.segment.tokens) - 1])
                for w in work if not w.is_prefill]

    launches = record_launches(gen, record)
    prompts, params = _case(llama8b[0].vocab_size)
    done = serve(gen, prompts, params, max_steps=20_000)
    det = {c.request_id: (c.token_ids, c.logprobs) for c, p in zip(done, params) if p.deterministic}
    free_logprobs = [lp for c, p in zip(done, params) if not p.deterministic for lp in c.logprobs]
    return det, [w for launch in launches for w in launch], free_logprobs, dict(gen.stats)


def test_windows_end_at_risky_drafts_on_cuda_and_commit_the_same_bits(llama8b, report):
    plain, plain_windows, free_logprobs, _ = _run(llama8b, 0.0)
    margins = sorted(m for w in plain_windows for m in w)
    assert margins and all(m >= 0 for m in margins)  # margins came back, not log-probs (those are <= 0)
    assert free_logprobs and all(lp <= 0 for lp in free_logprobs)  # free rows still read back log-probs
    risk = margins[int(0.3 * len(margins))]
    assert risk > 0
    cut, windows, _, stats = _run(llama8b, risk)
    assert cut == plain  # the same committed tokens and log-probs
    assert all(m >= risk for w in windows for m in w[:-1])
    ended = sum(1 for w in windows if w and w[-1] < risk)
    assert ended >= 5 and stats["risky_drafts"] >= ended
    assert any(m < risk for w in plain_windows for m in w[:-1])  # control: uncut windows hold them inside
    report("risk_margin_cuda", {"threshold": risk, "windows": len(windows), "ended_at_risky": ended,
                                "windows_without_cut": len(plain_windows), "rollbacks": stats["rollbacks"],
                                "risky_rollbacks": stats["risky_rollbacks"]})
