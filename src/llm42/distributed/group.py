"""One rank's tensor-parallel group and the collectives the sharded model needs.

Every collective here gives every rank the same bits: sums are all-reduces
whose result each rank receives whole (gloo and NCCL both hand every rank the
one reduced buffer), gathers are copies. Which of them the canonical pass may
use, and in which dtype, is the policy's choice (``FixedShapePolicy``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TensorParallel:
    """This process's place in a tensor-parallel group: ``rank`` of ``world_size``, over ``group``.

    ``group`` None is the default (world) process group. Each rank holds a
    contiguous slice of every sharded dimension: heads, kv heads, FFN width and
    vocabulary (``llm42.distributed.shard``).
    """

    rank: int
    world_size: int
    group: dist.ProcessGroup | None = None

    @classmethod
    def from_world(cls, world_size: int) -> "TensorParallel":
        """The default process group as a tensor-parallel group of ``world_size`` ranks (ValueError otherwise)."""
        if not dist.is_available() or not dist.is_initialized():
            raise ValueError(
                f"tensor_parallel={world_size} needs an initialized torch.distributed process group: run under "
                "llm42.distributed.launch(...) or torchrun (then llm42.distributed.init_tensor_parallel())"
            )
        if dist.get_world_size() != world_size:
            raise ValueError(f"tensor_parallel={world_size}, but the process group has {dist.get_world_size()} ranks")
        return cls(rank=dist.get_rank(), world_size=world_size)

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` summed over the ranks, in place (the library's order: fast path, or exact integer sums)."""
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.group)
        return t

    def all_reduce_max(self, t: torch.Tensor) -> torch.Tensor:
        """``t``'s elementwise max over the ranks, in place (a max is exact in any order)."""
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return t

    def all_gather(self, t: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's ``t`` (same shape on each), in rank order."""
        parts = [torch.empty_like(t) for _ in range(self.world_size)]
        dist.all_gather(parts, t.contiguous(), group=self.group)
        return parts

    def ordered_sum(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` summed over the ranks in float32 in rank order 0, 1, ..., then cast back.

        Each element is one fixed chain of additions, whatever the library's
        all-reduce algorithm, protocol or channel count would have picked for
        the message size: a row's bits depend on its own partials only. (They
        do depend on the number of ranks; ``exact.sharded_linear`` does not.)
        """
        parts = self.all_gather(t)
        total = parts[0].float()
        for part in parts[1:]:
            total = total + part.float()
        return total.to(t.dtype)

    def embed(self, table: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        """Rows of a vocabulary-parallel table: ``table`` [V / ranks, H] this rank's rows; returns [N, H].

        A rank that does not hold a token contributes -0.0, so the sum is that
        row's bits exactly on every rank and in any order (x + -0 == x for
        every x, signed zeros included; +0.0 would turn a -0.0 into +0.0).
        """
        rows_per_rank = table.shape[0]
        local = token_ids - self.rank * rows_per_rank
        is_mine = (local >= 0) & (local < rows_per_rank)
        rows = table[local.clamp(0, rows_per_rank - 1)]  # [N, H]
        rows = torch.where(is_mine[:, None], rows, torch.full_like(rows, -0.0))
        return self.all_reduce_sum(rows)

    def gather_vocab(self, logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """This rank's logits [L, V / ranks] gathered into the whole vocabulary [L, vocab_size] (copies only)."""
        return torch.cat(self.all_gather(logits), dim=-1)[:, :vocab_size]
