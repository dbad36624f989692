"""The canonical pass confined to a share of the SMs (``DVRGenerator(canonical_sms=N)``) keeps the contract.

The pass's stream belongs to a CUDA green context of N SMs and its graphs are captured there. Checked here, on the
Llama-3.1-8B shape: the pass's stream really reaches at most N SMs (a kernel that records each program's ``%smid``,
launched eagerly and replayed from a graph captured on that stream; control: on an ordinary stream the same kernel
reaches more SMs than N, so the bound is not vacuous), and a greedy and a sampled deterministic needle inside random
batches commit the bits they commit alone with every SM (the reference), while fast steps ran beside the passes.
Negative control: the same needle on the fast path drifts across those batches. With ``canonical_sms_max_rows``
(round 43) only passes of at most R rows are confined: the wider buckets' graphs are captured on an ordinary stream
of the pass's, which reaches more SMs than the green context holds, both kinds of pass run, and the needles keep
their bits.
"""

from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("triton")
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from llm42.cuda_graphs import green_contexts_supported  # noqa: E402
from tests.gpu.test_engine_cuda import (  # noqa: E402
    NEEDLES, FastStepsBesidePasses, make_generator, random_prompt, random_request, run_with_needles)

pytestmark = pytest.mark.gpu

BATCH_SIZES = (3, 16, 64)
NUM_SMS = 32
SM_GROUP = 8  # the driver rounds a green context's SMs up to its group size (8 on the H200)


@triton.jit
def _smid_kernel(out_ptr, SPIN: tl.constexpr):
    sm = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
    acc = sm
    for _ in range(SPIN):  # stay resident a while, so the programs spread over every SM they may use
        acc = (acc * 1103515245 + 12345) & 0xFFFF
    tl.store(out_ptr + tl.program_id(0), sm + (acc & 0))


def sms_reached(stream: torch.cuda.Stream, *, graph: bool) -> int:
    out = torch.zeros(2048, dtype=torch.int32, device="cuda")
    with torch.cuda.stream(stream):
        _smid_kernel[(out.numel(),)](out, SPIN=20000)
        if graph:
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=stream):
                _smid_kernel[(out.numel(),)](out, SPIN=20000)
            out.zero_()
            g.replay()
    torch.cuda.synchronize()
    return int(torch.unique(out).numel())


@pytest.mark.skipif(not green_contexts_supported(), reason="this torch has no green-context streams")
def test_needles_are_bit_identical_with_the_pass_on_a_share_of_the_sms(llama8b, report):
    cfg, _ = llama8b
    rng = random.Random(11)
    needle_prompt = random_prompt(rng, cfg.vocab_size, 300)
    alone = _needles_alone(llama8b, needle_prompt)
    gen = make_generator(llama8b, canonical_sms=NUM_SMS)
    stream = gen.verifier.canonical_pass._stream
    assert stream is not None
    total = torch.cuda.get_device_properties(0).multi_processor_count
    bound = -(-NUM_SMS // SM_GROUP) * SM_GROUP
    eager, graphed = sms_reached(stream, graph=False), sms_reached(stream, graph=True)
    ordinary = sms_reached(torch.cuda.Stream(), graph=False)
    report("canonical_sms_reached", {"eager": eager, "graph": graphed, "ordinary_stream": ordinary, "device": total})
    assert ordinary > bound, "control: an ordinary stream should reach more SMs than the green context holds"
    assert eager <= bound and graphed <= bound, f"the pass's stream reached {eager} / {graphed} SMs, over {bound}"

    _check_needles(gen, needle_prompt, alone, rng, report, "canonical_sms")
    gen.close()


def _needles_alone(llama8b, needle_prompt):
    reference = make_generator(llama8b)  # every SM
    alone = {name: reference.generate([needle_prompt], [p])[0] for name, p in NEEDLES.items()}
    reference.close()
    return {name: (tuple(c.token_ids), tuple(c.logprobs)) for name, c in alone.items()}


def _check_needles(gen, needle_prompt, alone, rng, report, label) -> None:
    """The deterministic needles commit their bits alone in random batches with fast steps beside the passes; the
    fast-only needle drifts (negative control)."""
    cfg = gen.cfg
    beside = FastStepsBesidePasses(gen)  # fast steps launched while a canonical pass is still running
    fast_outputs = {alone["fast_only"][0]}
    for batch_size in BATCH_SIZES:
        others = [random_request(rng, cfg.vocab_size) for _ in range(batch_size - len(NEEDLES))]
        got = run_with_needles(gen, needle_prompt, others, rng)
        for name in ("greedy", "sampled"):
            assert got[name] == alone[name], f"{name} needle differs at batch size {batch_size} ({label})"
        fast_outputs.add(got["fast_only"][0])
    report(f"{label}_fast_steps_beside_a_pass", beside.count)
    report(f"{label}_fast_only_distinct_outputs", len(fast_outputs))
    assert beside.count > 0, "no fast step ran beside a pass: the test did not exercise the overlap"
    assert len(fast_outputs) > 1  # negative control: unverified, the needle drifts with the batch


@pytest.mark.skipif(not green_contexts_supported(), reason="this torch has no green-context streams")
def test_only_passes_up_to_the_bound_are_confined_and_the_needles_keep_their_bits(llama8b, report):
    """``canonical_sms_max_rows=R``: R-row passes on the green context, wider ones (a long prompt's chunks, many
    windows) on an ordinary stream with every SM; both kinds run, and the needles commit the bits of every SM."""
    cfg, _ = llama8b
    rng = random.Random(12)
    needle_prompt = random_prompt(rng, cfg.vocab_size, 300)
    alone = _needles_alone(llama8b, needle_prompt)
    gen = make_generator(llama8b, canonical_sms=NUM_SMS, canonical_sms_max_rows=256)
    cp = gen.verifier.canonical_pass
    assert cp.confined_buckets == (256,) and len(cp.buckets) > 1, cp.buckets
    wide = cp._stream_for(cp.buckets[-1])
    assert cp._stream_for(256) is cp._stream and wide is cp._wide_stream and wide is not cp._stream
    bound = -(-NUM_SMS // SM_GROUP) * SM_GROUP
    narrow_sms, wide_sms = sms_reached(cp._stream, graph=True), sms_reached(wide, graph=True)
    report("canonical_sms_max_rows_reached", {"confined": narrow_sms, "wide": wide_sms})
    assert narrow_sms <= bound < wide_sms, (narrow_sms, wide_sms)
    used = []
    queued = cp._queued_stream

    def counting(segments, urgent):
        stream = queued(segments, urgent)
        used.append(stream is wide)
        return stream

    cp._queued_stream = counting
    _check_needles(gen, needle_prompt, alone, rng, report, "canonical_sms_max_rows")
    report("canonical_sms_max_rows_passes", {"wide": sum(used), "confined": len(used) - sum(used)})
    assert any(used) and not all(used), "both kinds of pass should have run"
    gen.close()
