"""Turns row segments into StepInputs and runs the model + sampler on them (the fast path's prefill rows)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llm42.inputs import StepInputs
from llm42.kv import KVStoreProtocol
from llm42.model.config import ModelConfig
from llm42.model.forward import forward
from llm42.model.weights import Weights
from llm42.params import SamplingParams
from llm42.policies.base import ReductionPolicy
from llm42.sampler import SamplingRows, logprob_details, sample, sampling_variant


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
        """The inputs a canonical pass of ``num_rows`` rows stages for ``segments`` (for tests and tools).

        Built by the one canonical-pass implementation (``llm42.verify.CanonicalPass``), eagerly.
        """
        from llm42.verify.canonical_pass import CanonicalPass  # verify/ sits above the runner

        return CanonicalPass(self.weights, self.cfg, None, num_rows, use_graph=False).stage(segments, kv)

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
            is_any_filtered=sampling_variant(p for p, _, _ in per_row)[1],
        )

    def run(self, inputs: StepInputs, kv: KVStoreProtocol, policy: ReductionPolicy,
            rows: SamplingRows) -> StepOutput:
        tokens, logprobs = self.forward_sample(inputs, kv, policy, rows)
        return StepOutput(tokens.tolist(), logprobs.tolist())

    def forward_sample(self, inputs: StepInputs, kv: KVStoreProtocol, policy: ReductionPolicy,
                       rows: SamplingRows) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward + sampler, results left on the device: (tokens [L], log-probs [L])."""
        return sample(forward(self.weights, self.cfg, inputs, kv.layers(), policy), rows)

    def forward_sample_details(self, inputs: StepInputs, kv: KVStoreProtocol, policy: ReductionPolicy,
                               rows: SamplingRows, is_processed: torch.Tensor, num_top: int
                               ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """``forward_sample`` with log-probs in each row's mode and top-N alternatives (``logprob_details``)."""
        logits = forward(self.weights, self.cfg, inputs, kv.layers(), policy)
        tokens, _ = sample(logits, rows)
        logprobs, top_ids, top_logprobs = logprob_details(logits, tokens, rows, is_processed, num_top)
        return tokens, logprobs, (top_ids, top_logprobs) if num_top else None
