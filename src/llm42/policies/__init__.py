"""Reduction policies: how the model's reducing ops are computed on each path."""

from llm42.policies.base import FusedRowOps, ReductionPolicy, RowOps, TorchRowOps, row_ops
from llm42.policies.batch_invariant import BatchInvariantPolicy
from llm42.policies.fast import FastPolicy
from llm42.policies.fixed_shape import FixedShapePolicy
from llm42.policies.noisy import NoisyFastPolicy

__all__ = [
    "ReductionPolicy", "FastPolicy", "FixedShapePolicy", "NoisyFastPolicy", "BatchInvariantPolicy",
    "RowOps", "TorchRowOps", "FusedRowOps", "row_ops",
]
