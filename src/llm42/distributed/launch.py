"""Start a tensor-parallel job: one process per rank, every rank running the same function.

The engine loop is SPMD: every rank builds the same ``DVRGenerator`` (its own
slice of the weights and of the K/V store) and makes the same calls in the
same order. Scheduling, admission, commit and rollback are deterministic
functions of the submitted requests and the sampled tokens, and the sampled
tokens are drawn on every rank from the same gathered logits, so the ranks
stay in lockstep without a control channel; only the model's collectives
cross processes.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import socket
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

# NVLink multicast stays off in every process started here (it can take a shared host's GPUs down)
_NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def default_backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def init_tensor_parallel(backend: str | None = None) -> int:
    """Join the process group torchrun describes (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``PORT``); returns the rank.

    NCCL (the default where CUDA is available) also pins this process to
    ``cuda:LOCAL_RANK``. Idempotent.
    """
    backend = default_backend() if backend is None else backend
    if backend == "nccl":
        for key, value in _NCCL_ENV.items():
            os.environ.setdefault(key, value)
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        dist.init_process_group(backend)
    return dist.get_rank()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# how often ``launch`` starts a job whose ranks could not form their process group (each time on a new port)
RENDEZVOUS_ATTEMPTS = 3


class RendezvousError(RuntimeError):
    """The ranks of a job could not form their process group (a rank's ``init_process_group`` raised, before ``fn``
    ran on it)."""


def _worker(rank: int, world_size: int, backend: str, port: int, num_threads: int | None,
            fn: Callable, args: tuple, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        try:
            init_tensor_parallel(backend)
        except BaseException:  # reported to the launcher, which starts the job again
            results.put((rank, "rendezvous", traceback.format_exc()))
            return
        try:
            # plain pickle: tensors travel by value (a queue would share their storage, gone once the rank exits)
            results.put((rank, "ok", pickle.dumps(fn(*args))))
        except BaseException:  # reported to the launcher, which raises it
            results.put((rank, "failed", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def launch(fn: Callable[..., Any], *args, tensor_parallel: int, backend: str | None = None,
           num_threads: int | None = None, timeout_s: float = 600.0) -> list[Any]:
    """Run ``fn(*args)`` on ``tensor_parallel`` new processes (ranks 0..n-1, one process group); returns
    their results in rank order.

    ``fn`` and ``args`` must be picklable (a module-level function); inside
    it, ``DVRGenerator.from_pretrained(path, tensor_parallel=n)`` loads that
    rank's slice. ``backend``: ``"gloo"`` (CPU) or ``"nccl"`` (one GPU per
    rank, ``cuda:rank``); default NCCL where CUDA is available. ``num_threads``
    sets each rank's torch thread count. A rank that raises (or a job past
    ``timeout_s``) stops every rank and raises RuntimeError with its traceback.
    A job whose ranks could not form their process group (a rendezvous that
    failed: a port taken meanwhile, a peer's connection dropped on a loaded
    host) is stopped and started again on a new port, up to
    ``RENDEZVOUS_ATTEMPTS`` times in all, then ``RendezvousError`` with the
    last rank's traceback; ``fn`` had not started on the rank that reported it.
    """
    if not isinstance(tensor_parallel, int) or isinstance(tensor_parallel, bool) or tensor_parallel < 1:
        raise ValueError(f"tensor_parallel must be a positive int, got {tensor_parallel!r}")
    backend = default_backend() if backend is None else backend
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    attempt = 1
    while True:
        try:
            return _launch_once(fn, args, tensor_parallel, backend, num_threads, timeout_s)
        except RendezvousError as exc:
            if attempt == RENDEZVOUS_ATTEMPTS:
                raise RendezvousError(f"{attempt} attempts failed; the last: {exc}") from None
            attempt += 1


def _launch_once(fn: Callable[..., Any], args: tuple, tensor_parallel: int, backend: str, num_threads: int | None,
                 timeout_s: float) -> list[Any]:
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(rank, tensor_parallel, backend, port, num_threads, fn, args, results),
                         daemon=True) for rank in range(tensor_parallel)]
    for proc in procs:
        proc.start()
    outputs: dict[int, Any] = {}
    try:
        for _ in procs:
            rank, status, value = _get(results, procs, timeout_s)
            if status == "rendezvous":
                raise RendezvousError(f"tensor-parallel rank {rank} could not join the process group:\n{value}")
            if status != "ok":
                raise RuntimeError(f"tensor-parallel rank {rank} failed:\n{value}")
            outputs[rank] = pickle.loads(value)
    finally:
        for proc in procs:
            proc.join(timeout=10 if len(outputs) == len(procs) else 0.1)
            if proc.is_alive():
                proc.terminate()
                proc.join()
    return [outputs[rank] for rank in range(tensor_parallel)]


def _get(results, procs: list, timeout_s: float):
    # SimpleQueue has no timeout: poll it, and notice a rank that died without reporting
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not results.empty():
            return results.get()
        dead = [p for p in procs if p.exitcode not in (None, 0)]
        if dead:
            raise RuntimeError(f"tensor-parallel rank process exited with code {dead[0].exitcode} without a result")
        time.sleep(0.02)
    raise RuntimeError(f"tensor-parallel job did not finish within {timeout_s} s")
