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


def _held_generator(llama8b, *, chained: bool, racing_staging: bool = False):
    gen = make_generator(llama8b, max_canonical_tokens=512)
    cpass = gen.verifier.canonical_pass
    assert gen._pool.chain_prefill and cpass.chains  # CUDA: chaining is on by default
    gen._pool.chain_prefill = chained
    behind = []
    launch = gen.verifier.launch

    def held_launch(work, kv):
        behind.append(gen._canonical_in_flight is not None)
        stream = cpass._stream if cpass._stream is not None else torch.cuda.current_stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            torch.cuda._sleep(HOLD_CYCLES)
        return launch(work, kv)

    gen.verifier.launch = held_launch
    if racing_staging:
        gen.generate([[5, 6, 7]], [PARAMS[0]])  # binds the pass's static buffers
        side = torch.cuda.Stream()
        rows = cpass._rows
        stagings = [cpass._staging_ints, cpass._staging_floats, cpass._select_staging, rows._staging,
                    rows._table_staging] + ([rows._tile_staging] if rows.tiles is not None else [])

        def racing(staging):
            def copy(dst=None, src=None):
                dst = staging.device_buffer if dst is None else dst
                with torch.cuda.stream(side):
                    dst.copy_(staging._host if src is None else src, non_blocking=True)
                side.synchronize()
            return copy

        for staging in stagings:
            staging.copy = racing(staging)
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
