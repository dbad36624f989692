"""Where a step puts a canonical pass on CUDA (``pass_before_read``, ``split_pass_steps``, ``apply_before_read``): the
same committed bits.

Each pass is held back on its stream (a spinning kernel queued ahead of it), so fast steps run while passes are
in flight and a finished pass is applied at the top of a later step: the steps the two options reorder. Not
vacuous: with ``pass_before_read`` some pass goes out before the previous fast step is read back (and without it
none does), with ``split_pass_steps`` some planned pass waits a step. Negative control: the same requests served
free (the fast path's own tokens) commit other bits, so a pass whose commits came from the fast path would fail
the comparison.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

pytest.importorskip("triton")

from llm42.params import SamplingParams  # noqa: E402
from tests.gpu.test_chained_prefill_cuda import _hold_passes  # noqa: E402
from tests.gpu.test_engine_cuda import make_generator, random_prompt  # noqa: E402
from tests.helpers import applies_between_launch_and_read  # noqa: E402

pytestmark = pytest.mark.gpu


def _case(cfg):
    rng = random.Random(77)
    prompts = [random_prompt(rng, cfg.vocab_size, rng.randint(8, 300)) for _ in range(16)]
    params = [SamplingParams(max_new_tokens=rng.randint(24, 64), deterministic=i % 4 != 3, logprobs=True,
                             ignore_eos=True, temperature=0.8 if i % 2 else 0.0, seed=500 + i) for i in range(16)]
    return prompts, params


def serve(llama8b, *, params=None, watch=None, **kwargs):
    """The case's requests through ``make_generator(**kwargs)``: the deterministic requests' outputs, the stats,
    and the sum over steps of ``watch(gen)()`` (``watch`` is called once on the new generator, before any step, and
    returns what to count after each step)."""
    cfg, _ = llama8b
    prompts, default_params = _case(cfg)
    gen = make_generator(llama8b, max_canonical_tokens=512, **kwargs)
    counted = watch(gen) if watch is not None else (lambda: 0)
    rids = [gen.submit(p, q) for p, q in zip(prompts, params or default_params)]
    total = 0
    while gen.has_unfinished():
        gen.step()
        total += counted()
    outputs = []
    for rid, q in zip(rids, default_params):
        c = gen.result(rid)
        if q.deterministic:
            outputs.append((tuple(c.token_ids), tuple(c.logprobs)))
    stats = dict(gen.stats)
    gen.close()
    return outputs, stats, total


def _early_launches(gen):
    """Passes held back; per step, whether a pass went out before the previous fast step's read-back."""
    _hold_passes(gen, lambda work: None)
    order: list[str] = []
    read, launch = gen.fast_step.read, gen.passes.launch

    def logged_read(*args, **kw):
        order.append("read")
        return read(*args, **kw)

    def logged_launch(*args, **kw):
        order.append("launch")
        return launch(*args, **kw)

    gen.fast_step.read, gen.passes.launch = logged_read, logged_launch

    def counted() -> bool:
        early = "launch" in order and "read" in order and order.index("launch") < order.index("read")
        order.clear()
        return early

    return counted


def _run(llama8b, params=None, **kwargs):
    """Outputs of the deterministic requests, the stats, and how many passes went out before a read-back."""
    return serve(llama8b, params=params, watch=_early_launches, **kwargs)


def test_pass_order_options_commit_the_default_bits(llama8b, report):
    reference, base_stats, base_early = _run(llama8b)
    assert base_early == 0 and base_stats["split_passes"] == 0
    assert base_stats["rollbacks"] > 0  # the fast path's tokens differ from the canonical ones
    got = {}
    for name, kwargs in {"pass_before_read": {"pass_before_read": True},
                         "split_pass_steps": {"split_pass_steps": True},
                         "both": {"pass_before_read": True, "split_pass_steps": True}}.items():
        outputs, stats, early = _run(llama8b, **kwargs)
        got[name] = {"early_launches": early, "split_passes": stats["split_passes"],
                     "canonical_passes": stats["canonical_passes"], "rollbacks": stats["rollbacks"]}
        assert outputs == reference, name
        if kwargs.get("pass_before_read"):
            assert early > 0, f"{name}: no pass went out before a read-back"
        if kwargs.get("split_pass_steps"):
            assert stats["split_passes"] > 0, f"{name}: no pass waited a step"
    report("pass_order_cuda", got)
    # negative control: the fast path's own tokens (the same requests served free) are not the committed bits
    cfg, _ = llama8b
    _, params = _case(cfg)
    free, _, _ = _run(llama8b, params=[dataclasses.replace(q, deterministic=False) for q in params])
    assert free != reference


def _applies_before_read(gen):
    """Passes held back; per step, whether a pass was applied after the step's fast launch and before its read-back
    of the fast step before (``apply_before_read``)."""
    _hold_passes(gen, lambda work: None)
    order: list[str] = []
    for owner, name, label in ((gen.fast_step, "launch", "fast"), (gen.passes, "apply_oldest", "apply"),
                               (gen.fast_step, "read", "read")):
        original = getattr(owner, name)

        def logged(*args, _original=original, _label=label, **kw):
            order.append(_label)
            return _original(*args, **kw)

        setattr(owner, name, logged)

    def counted() -> bool:
        between = applies_between_launch_and_read(order)
        order.clear()
        return between

    return counted


def test_apply_before_read_commits_the_default_bits(llama8b, report):
    """``apply_before_read`` on CUDA (the default since round 39): a pass applied while two fast steps are in flight
    (the one launched before the apply drafted from the state before it) commits the bits of the order before it
    (``apply_before_read=False``, every pass applied after the read), alone and with ``pass_before_read``; some step
    applied a pass before its read-back (not vacuous) and the order before never does (the control)."""
    reference, base_stats, base_between = serve(llama8b, watch=_applies_before_read, apply_before_read=False)
    assert base_between == 0 and base_stats["rollbacks"] > 0
    got = {}
    for name, kwargs in {"apply_before_read": {"apply_before_read": True},
                         "with_pass_before_read": {"apply_before_read": True, "pass_before_read": True}}.items():
        outputs, stats, between = serve(llama8b, watch=_applies_before_read, **kwargs)
        got[name] = {"applied_before_read": between, "canonical_passes": stats["canonical_passes"],
                     "rollbacks": stats["rollbacks"]}
        assert outputs == reference, name
        assert between > 0, f"{name}: no pass applied before a read-back"
    report("apply_before_read_cuda", got)
