"""Broken variants of DVR for the mutation controls: each must make the contract property fail.

A contract suite that passed for these would prove nothing. Each mutation keeps
the engine running normally (every request finishes, every pass commits) and
breaks exactly one thing the contract rests on:

- ``shrinking_pass``: the canonical pass shrinks to its real rows (M = the
  number of real rows instead of R), and its GEMMs split their K reduction by
  M, as library GEMMs pick split-K and tiles from the shape. Invariant 2 broken.
- ``batch_sized_split_kv``: the pass keeps R rows, but its attention splits the
  keys into a fixed number of chunks sized from the batch's longest context, as
  split-KV decode kernels pick their split from the batch. Invariant 2 broken.
- ``commit_keeps_rejected``: the commit rule keeps the first rejected candidate
  in place of the canonical token. The contract's commit rule broken.

The two broken passes compute their batch-dependent reductions in float32 in
this file, so they stay broken even if the library's own kernels become
row-independent by construction (a pass that merely changes its shape would
then give the same bits, and rightly pass).
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable

import torch

from llm42.inputs import StepInputs
from llm42.policies import FixedShapePolicy
from llm42.verify import CanonicalConfig, CanonicalWork, Commit

# builds a fresh verifier for one generator from (the suite's model, the canonical config, the key block)
Mutation = Callable[..., object]


class SplitKByRowsPolicy(FixedShapePolicy):
    """Canonical GEMMs that sum 1, 2, 4 or 8 float32 partial products along K, chosen by M."""

    def __init__(self, key_block: int, counts: Counter):
        super().__init__(key_block=key_block)
        self.counts = counts

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        # x: [M, K]; weight: [N, K]
        num_splits = min(8, 1 << (x.shape[0].bit_length() - 1))
        self.counts[f"gemm_splits_{num_splits}"] += 1
        gemm = super().linear
        parts = [gemm(xs, ws) for xs, ws in zip(x.chunk(num_splits, dim=-1), weight.chunk(num_splits, dim=-1))]
        out = functools.reduce(torch.add, parts)
        return out if bias is None else out + bias


class SplitKVByBatchPolicy(FixedShapePolicy):
    """Canonical attention in ``NUM_SPLITS`` key chunks of ceil(longest context in the pass / NUM_SPLITS)
    keys, each reduced in float32 and merged by log-sum-exp (flash-decoding's split-KV)."""

    NUM_SPLITS = 4

    def __init__(self, key_block: int, counts: Counter):
        super().__init__(key_block=key_block)
        self.counts = counts

    def attention(self, q, k_cache, v_cache, inputs: StepInputs, *, block_size, scale, sliding_window):
        # q: [N, Hq, D]; k_cache, v_cache: [num_slots, Hkv, D]
        num_rows, num_heads, head_dim = q.shape
        num_kv_heads = k_cache.shape[1]
        split = -(-inputs.max_context_len // self.NUM_SPLITS)
        self.counts[f"key_split_{split}"] += 1
        qf = q.float().view(num_rows, num_kv_heads, num_heads // num_kv_heads, head_dim) * scale
        tables = inputs.block_tables[inputs.row_seq]  # [N, MB]
        outs, lses = [], []
        for start in range(0, inputs.max_context_len, split):
            key_pos = torch.arange(start, start + split)
            blocks = tables[:, torch.clamp(key_pos // block_size, max=tables.shape[1] - 1)]
            slots = blocks * block_size + key_pos % block_size  # [N, KB]
            visible = key_pos <= inputs.positions[:, None]  # [N, KB]
            if sliding_window is not None:
                visible &= key_pos > inputs.positions[:, None] - sliding_window
            k = k_cache[slots].float()  # [N, KB, Hkv, D]
            v = torch.where(visible[:, :, None, None], v_cache[slots].float(), 0.0)
            s = torch.einsum("nhgd,nkhd->nhgk", qf, k).masked_fill(~visible[:, None, None, :], float("-inf"))
            lse = torch.logsumexp(s, dim=-1)  # [N, Hkv, G]; -inf where the chunk has no visible key
            finite_lse = torch.where(torch.isinf(lse), 0.0, lse)
            outs.append(torch.einsum("nhgk,nkhd->nhgd", torch.exp(s - finite_lse[..., None]), v))
            lses.append(lse)
        total = torch.logsumexp(torch.stack(lses), dim=0)
        out = functools.reduce(torch.add, [o * torch.exp(lse - total)[..., None] for o, lse in zip(outs, lses)])
        return out.view(num_rows, num_heads, head_dim).to(q.dtype)


class RealRowsVerifier:
    """A verifier whose pass has exactly as many rows as the work it is given (a verifier per size)."""

    def __init__(self, build: Callable[[int], object], policy):
        self._build = build
        self._by_rows: dict[int, object] = {}
        self.policy = policy

    def verify(self, work: list[CanonicalWork], kv) -> list[Commit]:
        num_rows = sum(len(w.segment.tokens) for w in work)
        if num_rows not in self._by_rows:
            self._by_rows[num_rows] = self._build(num_rows)
        return self._by_rows[num_rows].verify(work, kv)


class KeepsRejectedCandidate:
    """Wraps a verifier: after a mismatch it commits the first rejected candidate, not the canonical token.

    The K/V stays consistent (the rejected candidate's position is recomputed
    canonically in the next window), so the engine runs on normally: only the
    committed tokens follow the fast path.
    """

    def __init__(self, inner, counts: Counter):
        self._inner = inner
        self.policy = inner.policy
        self.counts = counts

    def verify(self, work: list[CanonicalWork], kv) -> list[Commit]:
        commits = self._inner.verify(work, kv)
        return [self._keep_rejected(w, c) for w, c in zip(work, commits, strict=True)]

    def _keep_rejected(self, work: CanonicalWork, commit: Commit) -> Commit:
        if work.is_prefill or not commit.num_rejected:
            return commit
        self.counts["kept_rejected_candidates"] += 1
        rejected = work.segment.tokens[1 + commit.num_accepted]
        return Commit(commit.rid, commit.token_ids[:-1] + (rejected,), commit.logprobs, commit.num_accepted,
                      commit.num_rejected, commit.num_kv_valid, commit.is_prefill)


def shrinking_pass(model, canonical: CanonicalConfig, key_block: int, *, counts: Counter) -> RealRowsVerifier:
    policy = SplitKByRowsPolicy(key_block, counts)
    return RealRowsVerifier(lambda num_rows: model.verifier(CanonicalConfig(window=num_rows, group=1), policy),
                            policy)


def batch_sized_split_kv(model, canonical: CanonicalConfig, key_block: int, *, counts: Counter):
    return model.verifier(canonical, SplitKVByBatchPolicy(key_block, counts))


def commit_keeps_rejected(model, canonical: CanonicalConfig, key_block: int, *, counts: Counter):
    return KeepsRejectedCandidate(model.verifier(canonical, FixedShapePolicy(key_block=key_block)), counts)
