"""Turns row segments into StepInputs and runs the model + sampler on them."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llm42.inputs import StepInputs
from llm42.kv_store import KVStoreProtocol
from llm42.model.config import ModelConfig
from llm42.model.forward import forward
from llm42.model.weights import Weights
from llm42.params import SamplingParams
from llm42.policies.base import ReductionPolicy
from llm42.sampler import SamplingRows, sample


@dataclass(frozen=True)
class Segment:
    """Consecutive token rows of one request: ``tokens[i]`` sits at position ``start + i``."""

    rid: int
    tokens: tuple[int, ...]
    start: int
    params: SamplingParams
    seed: int

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


@dataclass(frozen=True)
class StepOutput:
    tokens: list[int]  # one per logits row
    logprobs: list[float]


class ModelRunner:
    """Owns the weights and config; runs one forward + sample for a list of segments."""

    def __init__(self, weights: Weights, cfg: ModelConfig):
        self.weights = weights
        self.cfg = cfg
        self.device = weights.device
        # CUDA graphs of fast decode steps (llm42.verify.graph.DecodeGraphs); None = always eager
        self.decode_graphs = None

    def _tensor(self, values, dtype=torch.int64) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=self.device)

    def _table(self, kv: KVStoreProtocol, rid: int, width: int) -> list[int]:
        table = kv.block_table(rid)
        return table + [kv.scratch_block] * (width - len(table))

    def fast_inputs(self, segments: list[Segment], kv: KVStoreProtocol) -> StepInputs:
        """Varlen inputs, one sequence per segment, logits for each segment's last row."""
        tokens, positions, slots, row_seq, starts, lasts = [], [], [], [], [0], []
        for s_idx, seg in enumerate(segments):
            tokens += seg.tokens
            positions += range(seg.start, seg.end)
            slots += kv.slots(seg.rid, seg.start, seg.end)
            row_seq += [s_idx] * len(seg.tokens)
            starts.append(starts[-1] + len(seg.tokens))
            lasts.append(starts[-1] - 1)
        width = max(-(-seg.end // kv.block_size) for seg in segments)
        return StepInputs(
            token_ids=self._tensor(tokens),
            positions=self._tensor(positions),
            slot_mapping=self._tensor(slots),
            row_seq=self._tensor(row_seq),
            block_tables=self._tensor([self._table(kv, seg.rid, width) for seg in segments]),
            context_lens=self._tensor([seg.end for seg in segments]),
            seq_starts=tuple(starts),
            max_context_len=max(seg.end for seg in segments),
            logits_rows=self._tensor(lasts),
        )

    def canonical_inputs(self, segments: list[Segment], kv: KVStoreProtocol, num_rows: int) -> StepInputs:
        """Exactly ``num_rows`` rows, each its own sequence; unused rows are dummy rows.

        Every tensor's shape depends on ``num_rows`` and the model's context
        length only. Dummy rows hold token 0 at position 0, read the scratch
        block and write distinct scratch slots.
        """
        width = -(-self.cfg.max_position_embeddings // kv.block_size)
        num_real = sum(len(seg.tokens) for seg in segments)
        if num_real > num_rows:
            raise ValueError(f"canonical pass got {num_real} rows, more than R = {num_rows}")
        # per-row block tables [R, width], filled a request at a time (a long context makes this
        # table large; building it from Python lists would dominate a CPU pass)
        tables = torch.full((num_rows, width), kv.scratch_block, dtype=torch.int64)
        tokens, positions, slots = [], [], []
        for seg in segments:
            table = torch.tensor(kv.block_table(seg.rid), dtype=torch.int64)
            tables[len(tokens): len(tokens) + len(seg.tokens), : len(table)] = table
            tokens += seg.tokens
            positions += range(seg.start, seg.end)
            slots += kv.slots(seg.rid, seg.start, seg.end)
        for i in range(num_real, num_rows):
            tokens.append(0)
            positions.append(0)
            slots.append(kv.scratch_slot(i))
        return StepInputs(
            token_ids=self._tensor(tokens),
            positions=self._tensor(positions),
            slot_mapping=self._tensor(slots),
            row_seq=torch.arange(num_rows, device=self.device),
            block_tables=tables.to(self.device),
            context_lens=self._tensor(positions) + 1,
            seq_starts=tuple(range(num_rows + 1)),
            max_context_len=max(positions) + 1,
            logits_rows=None,
        )

    def sampling_rows(self, per_row: list[tuple[SamplingParams, int, int]], num_rows: int) -> SamplingRows:
        """``per_row``: (params, seed, position of the sampled token); rows past it are greedy dummies."""
        pad = num_rows - len(per_row)
        return SamplingRows(
            temperature=self._tensor([p.temperature for p, _, _ in per_row] + [0.0] * pad, torch.float32),
            top_k=self._tensor([p.top_k for p, _, _ in per_row] + [0] * pad),
            top_p=self._tensor([p.top_p for p, _, _ in per_row] + [1.0] * pad, torch.float32),
            seeds=self._tensor([s for _, s, _ in per_row] + [0] * pad),
            positions=self._tensor([q for _, _, q in per_row] + [0] * pad),
            is_any_sampled=any(p.temperature > 0 for p, _, _ in per_row),
        )

    def run(self, inputs: StepInputs, kv: KVStoreProtocol, policy: ReductionPolicy,
            rows: SamplingRows) -> StepOutput:
        logits = forward(self.weights, self.cfg, inputs, kv.layers(), policy)
        tokens, logprobs = sample(logits, rows)
        return StepOutput(tokens.tolist(), logprobs.tolist())

    def run_fast(self, segments: list[Segment], kv: KVStoreProtocol, policy: ReductionPolicy,
                 rows: SamplingRows) -> StepOutput:
        """A fast step over ``segments``: a captured decode graph when one fits (one token row per
        sequence, the graphs' policy and K/V store), otherwise eagerly through ``fast_inputs``."""
        graphs = self.decode_graphs
        if graphs is not None and policy is graphs.policy and graphs.can_run(segments, kv):
            logits = graphs.forward(segments, kv)
            tokens, logprobs = sample(logits, rows)
            return StepOutput(tokens.tolist(), logprobs.tolist())
        return self.run(self.fast_inputs(segments, kv), kv, policy, rows)
