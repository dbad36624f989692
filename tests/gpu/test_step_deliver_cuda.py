"""``step(deliver=...)`` on CUDA: tokens handed over before the canonical phase, each once, the same committed bits.

Passes are held back on their stream (a spinning kernel queued ahead of each), so fast steps run while passes are
in flight and passes are applied at the top of later steps and launched after reads: the steps whose canonical
phase ``deliver`` moves the free tokens ahead of. Checked: every request's tokens (handed over mid-step and
returned) are its Completion's, in order; the deterministic requests commit the bits they commit without
``deliver``; some step handed free tokens over and then launched or applied a pass (not vacuous). Negative
control: the same requests served free commit other bits, so the comparison can fail.
"""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("triton")

from tests.gpu.test_chained_prefill_cuda import _hold_passes  # noqa: E402
from tests.gpu.test_engine_cuda import make_generator  # noqa: E402
from tests.gpu.test_pass_order_cuda import _case  # noqa: E402

pytestmark = pytest.mark.gpu


def _serve(llama8b, *, early: bool, params=None):
    cfg, _ = llama8b
    prompts, default_params = _case(cfg)
    params = params or default_params
    gen = make_generator(llama8b, max_canonical_tokens=512)
    _hold_passes(gen, lambda work: None)
    rids = [gen.submit(p, q) for p, q in zip(prompts, params)]
    is_free = {rid: not q.deterministic for rid, q in zip(rids, params)}
    got: dict[int, list[int]] = {rid: [] for rid in rids}
    early_then_pass = 0
    while gen.has_unfinished():
        mark: dict = {}

        def deliver(events):
            mark["free"] = sum(len(t) for rid, t in events.items() if is_free[rid])
            mark["passes"], mark["committed"] = gen.stats["canonical_passes"], gen.stats["committed_tokens"]
            for rid, tokens in events.items():
                got[rid] += tokens

        events = gen.step(deliver=deliver) if early else gen.step()
        for rid, tokens in events.items():
            got[rid] += tokens
        if mark.get("free") and (gen.stats["canonical_passes"] > mark["passes"]
                                 or gen.stats["committed_tokens"] > mark["committed"]):
            early_then_pass += 1
    completions = [gen.result(rid) for rid in rids]
    gen.close()
    for rid, c in zip(rids, completions):
        assert got[rid] == c.token_ids  # each committed token once, in order
    det = [(tuple(c.token_ids), tuple(c.logprobs)) for c, q in zip(completions, default_params) if q.deterministic]
    return det, early_then_pass


def test_deliver_hands_free_tokens_over_before_the_canonical_phase_with_the_same_bits(llama8b, report):
    reference, _ = _serve(llama8b, early=False)
    got, early_then_pass = _serve(llama8b, early=True)
    report("step_deliver_cuda", {"steps_handing_over_before_a_pass": early_then_pass})
    assert got == reference
    assert early_then_pass > 0, "no step handed free tokens over before launching or applying a pass"
    # negative control: the fast path's own tokens (the same requests served free) are not the committed bits
    cfg, _ = llama8b
    _, params = _case(cfg)
    free, _ = _serve(llama8b, early=True, params=[dataclasses.replace(q, deterministic=False) for q in params])
    assert free != reference
