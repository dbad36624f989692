"""Does ``torch.compile`` pay on the CPU? The canonical pass and a fast decode step, eager vs compiled.

For each model it builds a generator, runs a few steps so the K/V store holds real
context, and then times, side by side in one process (medians, one thread):

- the canonical pass's forward (``FixedShapePolicy``, the exact CPU ops) at R rows,
  eager and ``torch.compile(dynamic=False)`` (inductor, default options), and whether
  the compiled logits are bit-identical to the eager ones;
- one fast decode step (``FastPolicy``) over the running batch: its input gather and forward, and the
  whole step with the sampler, eager and compiled (a build failure is recorded as the result).

The compile time (the first call) is reported apart. Results go to
benchmarks/results/cpu_compile.json; docs/engine.md ("torch.compile") quotes them.

    python benchmarks/cpu_compile.py [--out benchmarks/results/cpu_compile.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from llm42 import DVRGenerator, SamplingParams
from llm42.model.config import ModelConfig, RopeConfig
from llm42.model.forward import forward
from llm42.model.weights import random_weights


def _smollm2_shape(num_layers: int) -> ModelConfig:
    """SmolLM2-135M's widths (hidden 576, 9/3 heads of 64, FFN 1536, vocab 49152) at fewer layers."""
    return ModelConfig(family="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                       num_layers=num_layers, num_heads=9, num_kv_heads=3, head_dim=64,
                       max_position_embeddings=2048, rms_norm_eps=1e-5, rope=RopeConfig(theta=100000.0),
                       eos_token_ids=(2,), bos_token_id=1, tie_word_embeddings=True)


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def _measure(name: str, gen: DVRGenerator, *, num_requests: int, repeats: int) -> dict:
    params = SamplingParams(max_new_tokens=64, ignore_eos=True, deterministic=True)
    vocab = gen.cfg.vocab_size
    for i in range(num_requests):
        gen.submit([1, 3 + i % (vocab - 3), 7, 9], params)
    for _ in range(6):  # prompts prefilled, a few windows verified: the K/V holds real context
        gen.step()
    canonical = gen.verifier.canonical_pass
    layers = gen.kv.layers()
    staged = []  # the inputs of the next real pass, as staged (its real context length, not the bound)
    run = canonical._run
    canonical._run = lambda inputs: staged.append(inputs) or run(inputs)
    while not staged:
        gen.step()
    canonical._run = run
    inputs = staged[0]

    def canonical_forward():
        return forward(canonical.weights, canonical.cfg, inputs, layers, canonical.policy)

    state = gen.decode_state
    running = list(gen._pool.running.values())
    slots = [req.slot for req in running]
    num_seqs = len(slots)
    context = max(req.next_position for req in running) + 1  # what a fast step bounds its keys by
    variant = state.stage_batch(slots, num_seqs)  # every running request's decode row, as a fast step stages them

    def fast_forward():  # the decode step's input gather and forward (its logits), without the sampler
        return state._forward(num_seqs, variant, context)[2]

    def fast_sample():  # the decode step whole: gather, forward, sample, scatter
        return state.decode(num_seqs, variant=variant, max_context_len=context)[0]

    row = {"model": name, "canonical_rows": canonical.num_rows, "canonical_context": inputs.max_context_len,
           "decode_batch": num_seqs, "decode_context": context}
    for label, fn in (("canonical", canonical_forward), ("fast_forward", fast_forward),
                      ("fast_decode_step", fast_sample)):
        fn()
        eager_out = fn()
        compiled = torch.compile(fn, dynamic=False)
        start = time.perf_counter()
        try:
            compiled_out = compiled()
        except Exception as exc:  # noqa: BLE001 - a build failure is a result here
            row[f"{label}_compile_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            print(f"{name} {label}: torch.compile failed: {row[f'{label}_compile_error']}", flush=True)
            torch._dynamo.reset()
            continue
        row[f"{label}_compile_s"] = time.perf_counter() - start
        eager_ms, compiled_ms = [], []
        for _ in range(repeats):  # alternating: the machine's drift hits both alike
            eager_ms.append(_median_ms(fn, 1))
            compiled_ms.append(_median_ms(compiled, 1))
        row[f"{label}_eager_ms"] = statistics.median(eager_ms)
        row[f"{label}_compiled_ms"] = statistics.median(compiled_ms)
        row[f"{label}_ratio"] = row[f"{label}_compiled_ms"] / row[f"{label}_eager_ms"]
        if label == "canonical":
            row["canonical_bit_identical"] = bool(torch.equal(eager_out.view(torch.int32),
                                                              compiled_out.view(torch.int32)))
        print(f"{name} {label}: eager {row[f'{label}_eager_ms']:.2f} ms, compiled {row[f'{label}_compiled_ms']:.2f}"
              f" ms (ratio {row[f'{label}_ratio']:.2f}), compile {row[f'{label}_compile_s']:.1f} s", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/cpu_compile.json"))
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = [_measure("stories260K", DVRGenerator.from_pretrained(window=8, group=4, max_num_seqs=32),
                     num_requests=32, repeats=args.repeats)]
    cfg = _smollm2_shape(num_layers=4)
    rows.append(_measure("SmolLM2-135M shape, 4 of 30 layers, random weights",
                         DVRGenerator(random_weights(cfg, seed=0), cfg, window=8, group=4, max_num_seqs=32,
                                      kv_cache_tokens=8192),
                         num_requests=32, repeats=args.repeats))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "command": "python benchmarks/cpu_compile.py", "torch": torch.__version__, "threads": 1,
        "machine": platform.processor() or platform.machine(), "repeats": args.repeats, "rows": rows,
    }, indent=2) + "\n")


if __name__ == "__main__":
    main()
