"""The fast path's prompt chunks through static buffers: eager on the CPU, replayed from CUDA graphs on CUDA.

A fast prefill step of n rows over s prompt chunks stages its rows into static
buffers (each row its own "sequence" with a per-row block table, exactly like the
canonical pass), pads them to a row bucket, and samples the last row of each chunk
through a static list of ``max_seqs`` logits rows. On CUDA each (bucket, sampling
variant) is one captured graph, so a prefill step costs one launch instead of ~20 per
layer; on the CPU the same staging runs eagerly, so the CPU suite tests it.
"""

from __future__ import annotations

import torch

from llm42.cuda_graphs import PrefillGraphs, StaticRows
from llm42.inputs import StepInputs
from llm42.model.config import ModelConfig
from llm42.model.forward import forward
from llm42.model.weights import Weights
from llm42.policies.base import ReductionPolicy
from llm42.sampler import SamplingRows, sample, sampling_variant


class FastPrefill:
    def __init__(self, weights: Weights, cfg: ModelConfig, kv, policy: ReductionPolicy, *, max_rows: int,
                 max_seqs: int = 32, use_graph: bool, max_model_len: int | None = None,
                 bucket_step: int | None = None):
        """``max_model_len``: the longest sequence (default: the model's context), as ``DecodeState``'s.
        ``bucket_step``: the graphs' row ladder (``llm42.cuda_graphs.row_buckets``; ``None``: powers of two)."""
        self.weights = weights
        self.cfg = cfg
        self.kv = kv
        self.policy = policy
        self.max_rows = max_rows
        self.max_seqs = max_seqs
        device = weights.device
        self.device = device
        self.max_model_len = cfg.max_position_embeddings if max_model_len is None else max_model_len
        # the chunks' logits rows and sampling parameters go in the rows' one copy
        extra = (("logits_rows", (max_seqs,), torch.int64), ("sampling_ints", (3, max_seqs), torch.int64),
                 ("sampling_floats", (2, max_seqs), torch.float32))  # (top_k, seeds, positions), (temperature, top_p)
        self._rows = StaticRows(max_rows, self.max_model_len, kv, device, max_seqs=max_seqs, extra=extra)
        packed = self._rows.packed
        self._logits_rows = packed.device("logits_rows")
        self._sampling_ints, self._sampling_floats = packed.device("sampling_ints"), packed.device("sampling_floats")
        self.graphs = PrefillGraphs(self, bucket_step=bucket_step) if use_graph else None

    def can_run(self, num_rows: int, num_seqs: int) -> bool:
        return num_rows <= self.max_rows and num_seqs <= self.max_seqs

    def run(self, segments, kv) -> tuple[torch.Tensor, torch.Tensor]:
        """Stage ``segments`` (positions appended in ``kv``) and run them; (tokens [s], log-probs [s]) on the device."""
        bucket, variant, max_context_len = self.stage(segments, kv)
        if self.graphs is not None:
            out_tokens, out_logprobs = self.graphs.run(bucket, variant)
        else:
            out_tokens, out_logprobs = self.forward_sample(bucket, variant=variant,
                                                           max_context_len=max_context_len)
        return out_tokens[: len(segments)], out_logprobs[: len(segments)]

    def bucket_for(self, num_rows: int) -> int:
        """The rows a step of ``num_rows`` prompt rows runs: its graph bucket, or exactly ``num_rows`` eagerly."""
        return self.graphs.bucket_for(num_rows) if self.graphs is not None else num_rows

    def stage(self, segments, kv, *, bucket: int | None = None) -> tuple[int, tuple[bool, bool], int]:
        """Stage ``segments``' rows, padded to ``bucket`` rows (default ``bucket_for``), and their sampling rows.

        Returns (the bucket, the sampling variant, the largest position + 1).
        """
        num_rows = sum(len(seg.tokens) for seg in segments)
        bucket = self.bucket_for(num_rows) if bucket is None else bucket
        max_context_len, lasts = self._rows.stage_segments(kv, segments, num_rows=bucket, send=False)
        num_seqs = len(segments)
        packed = self._rows.packed
        select, ints, floats = packed.host("logits_rows"), packed.host("sampling_ints"), packed.host("sampling_floats")
        select[:num_seqs], select[num_seqs:] = lasts, 0
        ints[:, num_seqs:] = 0
        floats[0, num_seqs:], floats[1, num_seqs:] = 0.0, 1.0
        if num_seqs:
            ints[0, :num_seqs] = [s.params.top_k for s in segments]
            ints[1, :num_seqs] = [s.seed for s in segments]
            ints[2, :num_seqs] = [s.end for s in segments]
            # float64 -> float32 rounds to nearest, as torch.tensor on the Python floats did
            floats[0, :num_seqs] = [float(s.params.temperature) for s in segments]
            floats[1, :num_seqs] = [float(s.params.top_p) for s in segments]
        self._rows.send()
        return bucket, sampling_variant(s.params for s in segments), max_context_len

    def inputs(self, num_rows: int, *, max_context_len: int | None) -> StepInputs:
        """The ``StepInputs`` of the first ``num_rows`` staged rows, logits wanted at each chunk's last row."""
        return self._rows.inputs(num_rows, logits_rows=self._logits_rows,
                                 max_context_len=self.max_model_len if max_context_len is None else max_context_len)

    def sampling_rows(self, variant: tuple[bool, bool]) -> SamplingRows:
        """The staged sampling parameters of the ``max_seqs`` logits rows (padding rows greedy)."""
        ints, floats = self._sampling_ints, self._sampling_floats
        return SamplingRows(temperature=floats[0], top_k=ints[0], top_p=floats[1], seeds=ints[1],
                            positions=ints[2], is_any_sampled=variant[0], is_any_filtered=variant[1])

    def forward_sample(self, num_rows: int, *, variant: tuple[bool, bool], max_context_len: int | None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward over the first ``num_rows`` staged rows and sample the staged logits rows (no host syncs)."""
        inputs = self.inputs(num_rows, max_context_len=max_context_len)
        logits = forward(self.weights, self.cfg, inputs, self.kv.layers(), self.policy)
        return sample(logits, self.sampling_rows(variant))
