"""The fast path's per-token flip rate: how often a decode row's token changes with the batch.

``flip_rate`` measures, for rows with the *same prefix* (tokens and K/V), how
often the token a row gets in a batched decode step differs from the token the
same row gets alone:

1. every prompt is prefilled on the fast path (in chunks) into one K/V store;
2. each step decodes all rows together (batch = number of prompts, the decode
   graph of that bucket on CUDA), then re-runs ``num_alone`` of them (a
   different subset each step) one at a time (batch 1), each from the same
   device state and K/V;
3. a compared row *flips* when the two tokens differ. Every row then continues
   from one token (the alone token where it was compared, else the batched one),
   so both arms keep seeing identical prefixes: flips are counted per token,
   not per diverged sequence.

Greedy and sampled rows (Gumbel-max with the request's seed: the same noise in
both arms) are counted apart. This is the quantity the 8B shape's output head is
calibrated on (``llm42.bench.figures``): a trained model's rate, reproduced on
random weights. It drives the engine's parts directly (``DecodeState``,
``DecodeGraphs``), as ``tests/gpu/test_engine_cuda.py`` does, because the
engine never runs one row both ways.
"""

from __future__ import annotations

import random
import time

import torch

from llm42.cuda_graphs import DecodeGraphs
from llm42.engine.decode_state import DecodeState
from llm42.kv import KVStore
from llm42.model.config import ModelConfig
from llm42.model.weights import Weights
from llm42.params import SamplingParams
from llm42.policies import FastPolicy
from llm42.runner import ModelRunner, Segment

PREFILL_CHUNK_TOKENS = 4096


def _tally(flips: int, compared: int) -> dict:
    return {"num_compared": compared, "num_flips": flips, "rate": flips / compared if compared else None}


def flip_rate(weights: Weights, cfg: ModelConfig, prompts: list[tuple[int, ...]], *, num_steps: int,
              num_alone: int, sampled_share: float = 0.5, temperature: float = 0.8, seed: int = 0,
              use_cuda_graphs: bool = True, deadline: float | None = None, policy=None,
              min_steps: int = 0) -> dict:
    """Flips per compared token between batched and alone decode rows (see the module docstring).

    ``deadline`` cuts the decode steps, but never before ``min_steps`` of them: the set-up before
    the first step (prefill, graph capture, the first kernel compilations) can outlast a short slice.

    ``policy``: the fast path to probe (default ``FastPolicy()``; tests pass ``NoisyFastPolicy``).
    """
    device = weights.device
    num_rows = len(prompts)
    num_alone = min(num_alone, num_rows)
    block_size = 16
    room = [len(p) + num_steps + 2 for p in prompts]
    kv = KVStore(cfg, num_blocks=sum(-(-n // block_size) for n in room) + 4, block_size=block_size,
                 num_scratch_slots=max(256, PREFILL_CHUNK_TOKENS), dtype=weights.dtype, device=device,
                 enable_prefix_cache=False)
    policy = FastPolicy() if policy is None else policy
    runner = ModelRunner(weights, cfg)
    state = DecodeState(weights, cfg, kv, policy, max_num_seqs=num_rows)
    is_graphed = use_cuda_graphs and device.type == "cuda" and getattr(policy, "is_graph_safe", False)
    graphs = DecodeGraphs(state, max_batch_size=num_rows) if is_graphed else None
    rng = random.Random(f"flip-rows-{seed}")
    params = [SamplingParams(temperature=temperature, seed=1000 + i) if rng.random() < sampled_share
              else SamplingParams() for i in range(num_rows)]
    seeds = [p.seed or 0 for p in params]
    started = time.perf_counter()

    # prefill, a few prompts per forward pass
    positions = [len(p) for p in prompts]
    chunk: list[int] = []
    for rid in range(num_rows + 1):
        if rid < num_rows and sum(len(prompts[r]) for r in chunk) + len(prompts[rid]) <= PREFILL_CHUNK_TOKENS:
            chunk.append(rid)
            continue
        if chunk:
            segments = []
            for r in chunk:
                kv.allocate(r, room[r])
                kv.append(r, len(prompts[r]))
                segments.append(Segment(r, tuple(prompts[r]), 0, params[r], seeds[r]))
            rows = runner.sampling_rows([(params[r], seeds[r], len(prompts[r])) for r in chunk], len(chunk))
            first, _ = runner.forward_sample(runner.fast_inputs(segments, kv), kv, policy, rows)
            for r, token in zip(chunk, first.tolist()):
                state.admit(r, r, params[r], seeds[r])
                state.set_next(r, token, positions[r])
        chunk = [rid] if rid < num_rows else []
    state.flush()

    def decode(slots: list[int]) -> list[int]:
        num = len(slots)
        if graphs is not None:
            variant = state.stage_batch(slots, graphs.bucket_for(num))
            tokens, _ = graphs.run(num, variant)
        else:
            variant = state.stage_batch(slots, num)
            tokens, _ = state.decode(num, variant=variant,
                                     max_context_len=max(positions[s] for s in slots) + 1)
        return tokens.tolist()

    counts = {"greedy": [0, 0], "sampled": [0, 0]}  # flips, compared
    all_slots = list(range(num_rows))
    num_done = 0
    for step in range(num_steps):
        if deadline is not None and step >= min_steps and time.perf_counter() > deadline:
            break
        for s in all_slots:
            state.ensure_blocks(s, s, positions[s])
        state.flush()
        saved = state.snapshot()
        batched = decode(all_slots)
        chosen = sorted({(step * num_alone + j) % num_rows for j in range(num_alone)})
        following = list(batched)
        for s in chosen:
            state.restore(saved)
            (alone,) = decode([s])
            kind = "sampled" if params[s].temperature > 0 else "greedy"
            counts[kind][0] += alone != batched[s]
            counts[kind][1] += 1
            following[s] = alone
        state.restore(saved)
        for s in all_slots:
            positions[s] += 1
            state.set_next(s, following[s], positions[s])
        num_done += 1
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    flips = sum(c[0] for c in counts.values())
    compared = sum(c[1] for c in counts.values())
    return {
        **_tally(flips, compared),
        "greedy": _tally(*counts["greedy"]),
        "sampled": _tally(*counts["sampled"]),
        "num_rows": num_rows,
        "num_alone_per_step": num_alone,
        "num_steps": num_done,
        "num_steps_planned": num_steps,
        "sampled_share": sampled_share,
        "temperature": temperature,
        "mean_prompt_tokens": sum(map(len, prompts)) / max(1, num_rows),
        "cuda_graphs": graphs is not None,
        "elapsed_s": time.perf_counter() - started,
    }
