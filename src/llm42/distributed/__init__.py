"""Tensor parallelism over torch.distributed: gloo on CPUs, NCCL on GPUs, one process per rank.

``launch(fn, *args, tensor_parallel=n)`` starts the ranks (or run under
torchrun and call ``init_tensor_parallel()``); inside, every rank calls
``DVRGenerator.from_pretrained(path, tensor_parallel=n)`` and then the same
generator methods in the same order (see ``launch``'s module docstring).
"""

from llm42.distributed.group import TensorParallel
from llm42.distributed.launch import RendezvousError, default_backend, init_tensor_parallel, launch
from llm42.distributed.shard import check_shardable, load_shard, shard_config

__all__ = ["RendezvousError", "TensorParallel", "check_shardable", "default_backend", "init_tensor_parallel",
           "launch", "load_shard", "shard_config"]
