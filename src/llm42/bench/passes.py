"""Timing the engine's two passes on their own: a fast decode step and a canonical pass.

Both are staged the way the engine stages them — a decode batch through
``DecodeState`` (device-resident slots) replayed from ``DecodeGraphs``, a canonical
pass through ``CanonicalPass`` — over a K/V store holding random K/V (never
zeros) for ``num_seqs`` sequences of ``context`` positions. On the CPU the same
code runs eagerly and the graph-only figures are None.
"""

from __future__ import annotations

import time

import torch

from llm42.bench.devicetime import median_ms, synchronize
from llm42.cuda_graphs import DecodeGraphs
from llm42.engine.decode_state import DecodeState
from llm42.kv import KVStore
from llm42.model.config import ModelConfig
from llm42.model.weights import Weights
from llm42.params import SamplingParams
from llm42.policies import FixedShapePolicy
from llm42.runner import Segment
from llm42.verify.canonical_pass import CanonicalPass

BLOCK_SIZE = 16


def filled_kv(cfg: ModelConfig, weights: Weights, *, num_seqs: int, context: int, extra: int = 64,
              num_scratch_slots: int = 512, seed: int = 0) -> KVStore:
    """A K/V store with sequences 0 .. num_seqs - 1 of ``context`` positions, random K/V everywhere."""
    blocks_per_seq = -(-(context + extra) // BLOCK_SIZE)
    kv = KVStore(cfg, num_blocks=num_seqs * blocks_per_seq + 16, block_size=BLOCK_SIZE,
                 num_scratch_slots=num_scratch_slots, dtype=weights.dtype, device=weights.device,
                 enable_prefix_cache=False)
    generator = torch.Generator(device=weights.device).manual_seed(seed)
    for layer in range(cfg.num_layers):
        for cache in (kv.layers().k[layer], kv.layers().v[layer]):
            cache.copy_(torch.randn(cache.shape, generator=generator, device=weights.device, dtype=torch.float32))
    for rid in range(num_seqs):
        kv.allocate(rid, context + extra)
        kv.append(rid, context)
    return kv


class DecodeBench:
    """Decode steps of the first ``batch`` of ``kv``'s sequences, each at position ``context - 1``.

    Every timed call starts from the same device state (``reset`` restores the
    slots' tokens and positions between calls), so each call decodes the same rows.
    """

    def __init__(self, weights: Weights, cfg: ModelConfig, kv: KVStore, policy, *, num_seqs: int, context: int,
                 use_cuda_graphs: bool):
        self.device = weights.device
        self.context = context
        self.state = DecodeState(weights, cfg, kv, policy, max_num_seqs=num_seqs)
        self.graphs = (DecodeGraphs(self.state, max_batch_size=num_seqs)
                       if use_cuda_graphs and self.device.type == "cuda" else None)
        for rid in range(num_seqs):
            self.state.admit(rid, rid, SamplingParams(), 0)
            self.state.set_next(rid, rid * 7 % cfg.vocab_size, context - 1)
        self.state.flush()
        self._saved = self.state.snapshot()

    def reset(self) -> None:
        self.state.restore(self._saved)

    def stage(self, batch: int) -> None:
        num_rows = self.graphs.bucket_for(batch) if self.graphs is not None else batch
        self.state.stage_batch(list(range(batch)), num_rows)

    def eager(self, batch: int):
        return self.state.decode(batch, variant=(False, False), max_context_len=self.context)

    def replay(self, batch: int):
        return self.graphs.run(batch, (False, False))

    def time(self, batch: int, *, reps: int = 20) -> dict:
        """eager step, graph step incl. host staging, and graph replay alone (ms, medians)."""
        device = self.device
        self.stage(batch)
        eager_ms = median_ms(lambda: self.eager(batch), device, reps=reps, reset=self.reset)
        out = {"batch": batch, "eager_step_ms": eager_ms, "graph_step_ms": None, "graph_replay_ms": None,
               "bucket": None}
        if self.graphs is not None:
            out["bucket"] = self.graphs.bucket_for(batch)
            out["graph_step_ms"] = median_ms(lambda: (self.stage(batch), self.replay(batch)), device, reps=reps,
                                             reset=self.reset)
            self.stage(batch)
            out["graph_replay_ms"] = median_ms(lambda: self.replay(batch), device, reps=reps, reset=self.reset)
        return out


def canonical_segments(cfg: ModelConfig, *, window: int, group: int, context: int,
                       params: SamplingParams) -> list[Segment]:
    """``group`` verify windows of ``window`` rows ending at ``context`` (sequences 0 .. group - 1 of the store)."""
    return [Segment(rid, tuple((rid * 31 + i) % cfg.vocab_size for i in range(window)), context - window,
                    params, params.seed or 0) for rid in range(group)]


def time_canonical_pass(weights: Weights, cfg: ModelConfig, kv: KVStore, *, window: int, group: int,
                        context: int, use_cuda_graphs: bool, reps: int = 20,
                        variants: tuple[str, ...] = ("greedy", "sampled")) -> dict:
    """One canonical pass of R = window x group rows (all rows real, ``group`` windows at ``context``).

    Reported: the eager pass and, on CUDA, the captured pass incl. staging, its replay
    alone, and ``launch`` -> ``wait`` (own stream, pinned read-back; host clock), greedy
    and sampled, and whether replay equals eager bit for bit on every row.
    """
    device = weights.device
    num_rows = window * group
    policy = FixedShapePolicy()
    is_graphed = use_cuda_graphs and device.type == "cuda"
    eager = CanonicalPass(weights, cfg, policy, num_rows, use_graph=False)
    graphed = CanonicalPass(weights, cfg, policy, num_rows, use_graph=True) if is_graphed else None
    out = {"rows": num_rows, "window": window, "group": group, "context": context}
    all_variants = {"greedy": SamplingParams(deterministic=True),
                    "sampled": SamplingParams(temperature=0.8, top_p=0.95, seed=5, deterministic=True)}
    for label in variants:
        params = all_variants[label]
        segments = canonical_segments(cfg, window=window, group=group, context=context, params=params)
        per_row = [(s.params, s.seed, pos + 1) for s in segments for pos in range(s.start, s.end)]
        prefix = "" if label == "greedy" else "sampled_"
        out[f"{prefix}eager_pass_ms"] = median_ms(lambda: eager.run(eager.stage(segments, kv, per_row)), device,
                                                  reps=reps)
        want = [t.tolist() for t in eager.run(eager.stage(segments, kv, per_row))]
        if graphed is None:
            continue
        started = time.perf_counter()
        inputs = graphed.stage(segments, kv, per_row)
        graphed.run(inputs)  # binds the store and captures (forward once, this sampler variant once)
        synchronize(device)
        out[f"{prefix}graph_capture_s"] = time.perf_counter() - started
        out[f"{prefix}graph_pass_ms"] = median_ms(lambda: graphed.run(graphed.stage(segments, kv, per_row)),
                                                  device, reps=reps)
        inputs = graphed.stage(segments, kv, per_row)
        out[f"{prefix}graph_replay_ms"] = median_ms(lambda: graphed.run(inputs), device, reps=reps)
        out[f"{prefix}launch_wait_ms"] = _host_median_ms(lambda: graphed.launch(segments, kv, per_row).wait(),
                                                         reps=reps)
        got = [t.tolist() for t in graphed.run(graphed.stage(segments, kv, per_row))]
        out[f"{prefix}graph_equals_eager"] = got == want
    best = out.get("graph_pass_ms") or out["eager_pass_ms"]
    out["ms_per_committed_token"] = best / num_rows  # at full acceptance every row commits one token
    return out


def _host_median_ms(fn, *, reps: int) -> float:
    for _ in range(min(3, reps)):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2]
