"""A fast step's decode rows and prompt chunks in one forward pass: eager on the CPU, replayed on CUDA.

A step that carries both used to run two whole forward passes: the decode batch's graph, then the
prompt chunks' graph. Measured on the H200 (benchmarks/results/h200_round7/profile_steps_*.json),
such a step took the decode graph's time plus the prefill graph's, each with its own fixed cost
(about 1.1 ms of launches for SmolLM2's 30 layers at any batch) and, on the 8B shape, its own
read of every weight. Here both row sets go through one forward (``StepInputs.join``): the GEMMs,
norms and RoPE run once over all rows, attention once per part (the split-KV decode kernel on the
decode rows, the tiled prefill kernel on the prompt rows), and one sampler call samples every decode
row and each chunk's last row. Each row's arithmetic is the fast path's, as before; which rows share
its GEMMs changes, as it does whenever the batch changes (the fast path's results may drift with
the batch; the canonical pass is untouched).

On CUDA each (decode bucket, prompt-row bucket, sampling variant) is one captured graph
(``MixedGraphs``), reading the decode state's persistent buffers and the prefill's static rows.
"""

from __future__ import annotations

import torch

from llm42.cuda_graphs import DecodeGraphs, MixedGraphs, row_buckets
from llm42.engine.decode_state import DecodeState
from llm42.engine.prefill import FastPrefill
from llm42.inputs import StepInputs
from llm42.model.forward import forward
from llm42.sampler import SamplingRows, sample_with_margins


class MixedStep:
    """Runs the decode rows staged in ``decode_state.batch`` and the prompt chunks staged in ``prefill`` as one pass."""

    MIXED_VARIANTS = ((True, False), (True, True))  # the sampler variants a mixed step runs (``variant``)

    def __init__(self, decode_state: DecodeState, prefill: FastPrefill, decode_graphs: DecodeGraphs | None, *,
                 use_graph: bool, bucket_step: int | None = None):
        """``bucket_step``: the decode rows' ladder (``llm42.cuda_graphs.row_buckets``; ``None``: powers of two);
        the prompt rows take ``prefill``'s."""
        self.decode_state = decode_state
        self.prefill = prefill
        self._decode_graphs = decode_graphs
        self.graphs = MixedGraphs(self) if use_graph else None
        self.last_variant = (True, False)  # the sampler variant of the step run last (``stats["filtered_steps"]``)
        self._decode_ladder = (row_buckets(decode_graphs.max_batch_size, bucket_step)
                               if use_graph and decode_graphs is not None else None)

    def can_run(self, num_decode: int, num_prompt_rows: int, num_seqs: int) -> bool:
        if not self.prefill.can_run(num_prompt_rows, num_seqs):
            return False
        return self._decode_graphs is None or num_decode <= self._decode_graphs.max_batch_size

    def decode_buckets(self) -> tuple[int, ...]:
        """Every decode bucket a mixed step may run (``decode_bucket``'s values)."""
        return self._decode_ladder or ()

    def decode_bucket(self, num_decode: int) -> int:
        """The decode rows a step of ``num_decode`` runs (``stage_batch`` pads the batch to it).

        With graphs: the smallest bucket >= ``num_decode`` of the ladder ``row_buckets(largest decode graph,
        bucket_step)``: powers of two from 16, then multiples of ``bucket_step``. Coarser than the decode graphs'
        buckets (every 16): each (decode bucket, prompt bucket, variant) is a graph of its own, captured the
        first time it runs. Eagerly: exactly ``num_decode``.
        """
        if self._decode_ladder is None:
            return num_decode
        return next(b for b in self._decode_ladder if b >= num_decode)

    @staticmethod
    def variant(decode_variant: tuple[bool, bool], prompt_variant: tuple[bool, bool]) -> tuple[bool, bool]:
        """The sampler a mixed step runs: always the sampling one (greedy rows still take their argmax, the
        same tokens), filtered if any row filters. Two variants, not three: each is a graph per bucket pair."""
        return True, decode_variant[1] or prompt_variant[1]

    def run(self, num_decode: int, decode_variant: tuple[bool, bool], decode_max_context_len: int, segments, kv
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The decode batch (staged, ``decode_bucket(num_decode)`` rows) and ``segments`` (appended in ``kv``).

        Returns (decode tokens [num_decode], their values (``DecodeState.draft_values``), each segment's sampled
        token [s], its log-prob), on the device; the decode state is advanced as by a decode step.
        """
        bucket, prompt_variant, prompt_max_context_len = self.prefill.stage(segments, kv)
        variant = self.last_variant = self.variant(decode_variant, prompt_variant)
        if self.graphs is not None:
            outputs = self.graphs.run(self.decode_bucket(num_decode), bucket, variant)
        else:
            outputs = self.forward_sample(num_decode, bucket, variant=variant,
                                          max_context_len=max(decode_max_context_len, prompt_max_context_len))
        tokens, logprobs, prompt_tokens, prompt_logprobs = outputs
        num_seqs = len(segments)
        return tokens[:num_decode], logprobs[:num_decode], prompt_tokens[:num_seqs], prompt_logprobs[:num_seqs]

    def forward_sample(self, num_decode: int, num_prompt_rows: int, *, variant: tuple[bool, bool],
                       max_context_len: int | None
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One forward over the staged decode rows then the staged prompt rows, one sampler call (no host syncs)."""
        state, prefill = self.decode_state, self.prefill
        idx, positions, decode_inputs = state.decode_inputs(num_decode, max_context_len)
        inputs = StepInputs.join([decode_inputs, prefill.inputs(num_prompt_rows, max_context_len=max_context_len)])
        logits = forward(state.weights, state.cfg, inputs, state.kv.layers(), state.policy)
        decode_rows = state.sampling_rows(idx, positions, variant)
        prompt_rows = prefill.sampling_rows(variant)
        rows = SamplingRows(
            temperature=torch.cat([decode_rows.temperature, prompt_rows.temperature]),
            top_k=torch.cat([decode_rows.top_k, prompt_rows.top_k]),
            top_p=torch.cat([decode_rows.top_p, prompt_rows.top_p]),
            seeds=torch.cat([decode_rows.seeds, prompt_rows.seeds]),
            positions=torch.cat([decode_rows.positions, prompt_rows.positions]),
            is_any_sampled=variant[0], is_any_filtered=variant[1],
        )
        tokens, logprobs, margins = sample_with_margins(logits, rows)
        state.advance(idx, positions, tokens[:num_decode])
        values = state.draft_values(idx, logprobs[:num_decode], margins[:num_decode])
        return tokens[:num_decode], values, tokens[num_decode:], logprobs[num_decode:]
