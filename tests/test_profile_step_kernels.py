"""``benchmarks/device/profile_step_kernels.py``'s decode-context recorder on the CPU: each step's entry, read from
the plan (prompt + generated tokens of each request it decodes), is the keys the decode rows' attention reads,
the summed ``context_lens`` of the decode inputs the engine builds; a prefill-only step records 0. The decode
attention's K/V bytes and achieved bandwidth in the profile follow from it."""

from __future__ import annotations

import torch

from llm42 import DVRGenerator, SamplingParams
from llm42.bench.models import build_model
from tests.helpers import load_device_script


def test_decode_context_is_each_decoded_requests_prompt_plus_generated_tokens():
    script = load_device_script("profile_step_kernels")
    model = build_model("tiny", device="cpu", dtype=torch.float32, max_positions=64)
    gen = DVRGenerator(model.weights, model.cfg, kv_cache_tokens=512)
    read = []  # the keys each decode forward's attention reads, as the engine stages them
    stage = gen.decode_state.decode_inputs

    def staged(num_rows, max_context_len):
        idx, positions, inputs = stage(num_rows, max_context_len)
        read.append(int(inputs.context_lens.sum()))
        return idx, positions, inputs

    gen.decode_state.decode_inputs = staged
    contexts = script.record_decode_context(gen)
    for i, prompt_len in enumerate((4, 7, 9)):
        gen.submit(list(range(3, 3 + prompt_len)), SamplingParams(max_new_tokens=3 + i, ignore_eos=True))
    while gen.has_unfinished():
        gen.step()
    assert contexts[0] == 0  # the first step prefills the prompts: nothing decoded
    assert [c for c in contexts if c] == read and len(read) >= 3
