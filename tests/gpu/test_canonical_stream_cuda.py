"""The canonical pass on its own CUDA stream (``canonical_stream=True``) keeps the contract.

Round 2 ran the pass on a side stream and a sampled needle differed at batch size 3, then the
device hung: every CUDA graph had been captured on torch's one default capture stream, so the
pass's cuBLAS GEMMs and the fast steps' shared one workspace while they ran at the same time.
The pass's graphs are now captured on its own stream. Here, on the Llama-3.1-8B shape: a
greedy and a sampled deterministic needle alone on the caller's stream (the reference) and
inside random batches with the side-stream pass (its stream at equal, lower or higher priority than the
fast steps'), bit for bit; the pass really ran on its own
stream and fast steps were launched while passes were in flight. Negative control: the same
needle on the fast path drifts across those batches.
"""

from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("triton")

from tests.gpu.test_engine_cuda import (  # noqa: E402
    NEEDLES, FastStepsBesidePasses, make_generator, random_prompt, random_request, run_with_needles)

pytestmark = pytest.mark.gpu

BATCH_SIZES = (3, 16, 64, 128)


@pytest.mark.parametrize("priority", ["equal", "fast", "high", "prompts"])
def test_needles_are_bit_identical_with_the_pass_on_its_own_stream(llama8b, report, priority):
    # "fast" (prioritize_fast): each step's work on a high-priority stream, the pass's on the lowest (round 14);
    # "high" / "prompts" (canonical_priority): every pass, or those with prompt chunks, on a stream of the highest
    # priority, the steps' on the default (round 26)
    prioritize_fast = priority == "fast"
    canonical_priority = priority if priority in ("high", "prompts") else "low"
    cfg, _ = llama8b
    rng = random.Random(7)
    needle_prompt = random_prompt(rng, cfg.vocab_size, 300)
    reference = make_generator(llama8b, canonical_stream=False, wide_verify=False)  # round 8's default
    alone = {name: reference.generate([needle_prompt], [p])[0] for name, p in NEEDLES.items()}
    alone = {name: (tuple(c.token_ids), tuple(c.logprobs)) for name, c in alone.items()}
    reference.close()

    # on CUDA the default since round 9: passes on their own stream, wide verify
    gen = make_generator(llama8b, prioritize_fast=prioritize_fast, canonical_priority=canonical_priority)
    canonical = gen.verifier.canonical_pass
    assert canonical._stream is not None and gen._max_canonical_results is not None
    if prioritize_fast:  # a stream of higher priority (lower number) than the pass's
        assert gen._step_stream.priority < canonical._stream.priority
    if canonical_priority != "low":  # the pass's stream(s) above the one the steps run on (the caller's, default)
        steps = torch.cuda.current_stream().priority
        assert gen._step_stream is None and canonical._urgent_stream.priority < steps
        assert (canonical._stream.priority < steps) == (canonical_priority == "high")
    beside = FastStepsBesidePasses(gen)  # fast steps launched while a canonical pass is still running
    fast_outputs = {alone["fast_only"][0]}
    for batch_size in BATCH_SIZES:
        others = [random_request(rng, cfg.vocab_size) for _ in range(batch_size - len(NEEDLES))]
        got = run_with_needles(gen, needle_prompt, others, rng)
        for name in ("greedy", "sampled"):
            assert got[name] == alone[name], f"{name} needle differs at batch size {batch_size}"
        fast_outputs.add(got["fast_only"][0])
    report(f"side_stream_fast_steps_beside_a_pass_priority_{priority}", beside.count)
    report(f"side_stream_fast_only_distinct_outputs_priority_{priority}", len(fast_outputs))
    assert beside.count > 0, "no fast step ran beside a pass: the test did not exercise the overlap"
    assert len(fast_outputs) > 1  # negative control: unverified, the needle drifts with the batch
    gen.close()
