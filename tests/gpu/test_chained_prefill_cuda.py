"""Chained prompt passes on CUDA: a long deterministic prompt's next chunk is staged and launched while the pass
of the chunk before it is still queued, and every committed bit stays what unchained passes commit.

Each canonical pass is held back on the device (``torch.cuda._sleep`` queued on its stream before it), so the
engine stages the next chunk while the pass before it has not even started: its staging must wait behind that
pass on the stream (``CanonicalPass.chains``) and its results go to the other set of pinned rows. The reference
runs the same prompts with chaining off. Negative control: staging copies that land at once, on a stream of their
own (not behind the pass in flight), hand the held-back pass the next chunk's rows: other bits.
"""

from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("triton")

from llm42.params import SamplingParams  # noqa: E402
from tests.gpu.test_engine_cuda import make_generator, random_prompt  # noqa: E402

pytestmark = pytest.mark.gpu

HOLD_CYCLES = 20_000_000  # ~10 ms of a spinning kernel ahead of each pass
PARAMS = [SamplingParams(max_new_tokens=6, deterministic=True, logprobs=True, ignore_eos=True),
          SamplingParams(max_new_tokens=6, deterministic=True, logprobs=True, ignore_eos=True, temperature=0.8,
                         top_p=0.95, seed=77)]


def _hold_passes(gen, record) -> list:
    """Queue a spinning kernel on the pass's stream ahead of each pass; ``record(work)`` per launch goes to the
    returned list (called before the launch, while the pass before it may still be in flight)."""
    cpass = gen.verifier.canonical_pass
    behind = []
    launch = gen.verifier.launch

    def held_launch(work, kv):
        behind.append(record(work))
        stream = cpass._stream if cpass._stream is not None else torch.cuda.current_stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            torch.cuda._sleep(HOLD_CYCLES)
        return launch(work, kv)

    gen.verifier.launch = held_launch
    return behind


def _held_generator(llama8b, *, chained: bool, racing_staging: bool = False):
    gen = make_generator(llama8b, max_canonical_tokens=512)
    cpass = gen.verifier.canonical_pass
    assert gen._pool.chain_prefill and cpass.chains  # CUDA: chaining is on by default
    gen._pool.chain_prefill = chained
    behind = _hold_passes(gen, lambda work: gen.passes.oldest is not None)
    if racing_staging:
        gen.generate([[5, 6, 7]], [PARAMS[0]])  # binds the pass's static buffers
        side = torch.cuda.Stream()
        packed = cpass._rows.packed  # the pass's one staging copy (rows, tiles, tables, sampling and result rows)

        def racing(nbytes=None):
            n = packed.nbytes if nbytes is None else nbytes
            with torch.cuda.stream(side):
                packed._device[:n].copy_(packed._host[:n], non_blocking=True)
            side.synchronize()

        packed.copy = racing
        behind.clear()
    return gen, behind


def _outputs(gen, prompts):
    return [(tuple(c.token_ids), tuple(c.logprobs)) for c in gen.generate(prompts, PARAMS)]


def test_chained_prompt_passes_commit_the_unchained_bits(llama8b, report):
    cfg, _ = llama8b
    rng = random.Random(22)
    prompts = [random_prompt(rng, cfg.vocab_size, n) for n in (1700, 1300)]
    gen, behind = _held_generator(llama8b, chained=False)
    reference = _outputs(gen, prompts)
    assert not any(behind)
    gen.close()
    gen, behind = _held_generator(llama8b, chained=True)
    chained = _outputs(gen, prompts)
    report("chained_prefill_passes_behind", [sum(behind), len(behind)])
    assert sum(behind) >= 2, f"{sum(behind)} of {len(behind)} passes launched behind another: nothing chained"
    assert chained == reference
    gen.close()

    gen, behind = _held_generator(llama8b, chained=True, racing_staging=True)
    racing = _outputs(gen, prompts)
    assert sum(behind) >= 2
    assert racing != reference, "staging that does not wait for the pass in flight went unnoticed"
    gen.close()


def _windows_generator(llama8b, chain: str):
    """Passes held back as above, for requests that decode; one pass takes at most G windows (R rows, no wide
    verify), so the requests a pass leaves out have windows due while it is in flight: behind it
    (``chain_passes="all"``) or waiting for it (``"off"``). The per-launch record says which chained."""
    gen = make_generator(llama8b, chain_passes=chain, max_canonical_tokens=256, wide_verify=False)
    behind = _hold_passes(gen, lambda work: (gen.passes.oldest is not None,
                                             sum(not w.is_prefill for w in work)))
    return gen, behind


def test_chained_verify_passes_commit_the_unchained_bits(llama8b, report):
    """Twelve deterministic requests (more than a pass's G windows) beside free ones: windows launched behind a
    held-back pass commit what waiting for it commits."""
    cfg, _ = llama8b
    rng = random.Random(23)
    lengths = [rng.randint(10, 200) for _ in range(16)]
    prompts = [random_prompt(rng, cfg.vocab_size, n) for n in lengths]
    params = [SamplingParams(max_new_tokens=rng.randint(40, 90), deterministic=i % 4 != 3, logprobs=True,
                             ignore_eos=True, temperature=0.8 if i % 2 else 0.0, seed=100 + i)
              for i in range(16)]

    def outputs(gen):
        return [(tuple(c.token_ids), tuple(c.logprobs)) for c, p in zip(gen.generate(prompts, params), params)
                if p.deterministic]

    gen, behind = _windows_generator(llama8b, "off")
    reference = outputs(gen)
    assert not any(b for b, _ in behind)
    gen.close()
    gen, behind = _windows_generator(llama8b, "all")
    chained = outputs(gen)
    num_chained = sum(1 for b, windows in behind if b and windows)
    report("chained_verify_passes_behind", [num_chained, len(behind)])
    assert num_chained >= 2, f"{num_chained} of {len(behind)} passes with windows launched behind another"
    assert chained == reference
    gen.close()
