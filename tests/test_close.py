"""A generator's device memory goes when it does: no reference cycles hold it, and close() (or the
context manager) drops it at once, aborting what still runs."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from llm42 import DVRGenerator, SamplingParams
from llm42.kv import KVStore
from llm42.kv.tensors import KVTensors
from llm42.model.weights import random_weights
from llm42.policies import FixedShapePolicy
from llm42.runner import ModelRunner
from llm42.verify import CanonicalConfig
from tests.helpers import tiny_config
from tests.test_online import LaggingVerifier

CFG = tiny_config()
WEIGHTS = random_weights(CFG, seed=2)
DET = SamplingParams(max_new_tokens=10, deterministic=True, ignore_eos=True)
FREE = SamplingParams(max_new_tokens=10, ignore_eos=True)


def used_generator(device: str = "cpu", *, lagging: bool = False) -> DVRGenerator:
    """A generator that went through every path that allocates: generate, stream (left early), abort,
    a canonical pass (``lagging``: one still in flight, as on CUDA) and a fast step still in flight."""
    weights = WEIGHTS if device == "cpu" else random_weights(CFG, seed=2, device=device)
    kwargs = {}
    if lagging:
        kwargs["verifier"] = LaggingVerifier(ModelRunner(weights, CFG), FixedShapePolicy(), CanonicalConfig(4, 2))
    gen = DVRGenerator(weights, CFG, window=4, group=2, kv_cache_tokens=512, block_size=8, **kwargs)
    gen.generate([[5, 6, 7], [8, 9]], [DET, FREE])
    stream = gen.stream([[1, 2, 3]], DET)
    next(stream)
    stream.close()
    rid = gen.submit([4, 4, 4], DET)
    gen.submit([3, 3], FREE)
    gen.step()
    gen.abort(rid)
    gen.step()
    return gen


def device_tensors(gen: DVRGenerator) -> list[weakref.ref]:
    tensors = [*gen.kv._tensors.k, *gen.kv._tensors.v, gen.decode_state.tokens, gen.decode_state.tables]
    return [weakref.ref(t) for t in tensors]


def tensors_die_with(box: list[DVRGenerator]) -> bool:
    """Drop the only reference to the generator in ``box`` with the garbage collector off: do its tensors go?"""
    refs = device_tensors(box[0])
    gc.collect()
    gc.disable()
    try:
        box.clear()
        return all(r() is None for r in refs)
    finally:
        gc.enable()


@pytest.mark.parametrize("lagging", [False, True])
def test_deleting_a_generator_frees_its_tensors_without_the_garbage_collector(lagging):
    # the test holds no part of it: only the generator owns them
    assert tensors_die_with([used_generator(lagging=lagging)]), "a reference cycle keeps the tensors alive"


def test_the_cycle_check_catches_a_cycle():
    # negative control: the same check fails for a generator caught in a cycle
    gen = used_generator()
    gen.decode_state.owner = gen
    refs = device_tensors(gen)
    box = [gen]
    del gen  # the box holds the only reference from outside the cycle
    assert not tensors_die_with(box)
    gc.collect()
    assert all(r() is None for r in refs)


def test_no_llm42_object_ends_up_in_cyclic_garbage():
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gen = used_generator()
        del gen
        gc.collect()
        leaked = {type(o).__module__ + "." + type(o).__qualname__ for o in gc.garbage
                  if type(o).__module__.startswith("llm42")}
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert not leaked, leaked


def test_close_aborts_everything_and_drops_device_memory_while_the_generator_is_referenced():
    gen = used_generator()
    running = gen.submit([7, 7, 7], DET)
    gen.step()
    refs = device_tensors(gen)
    gen.close()
    assert gen.is_closed
    assert all(r() is None for r in refs)
    for call in (lambda: gen.submit([1], DET), gen.step, lambda: gen.abort(running),
                 lambda: gen.result(running), lambda: gen.generate([[1]], DET), lambda: list(gen.stream([[1]], DET)),
                 gen.has_unfinished):
        with pytest.raises(RuntimeError, match="closed"):
            call()
    gen.close()  # idempotent


def _wrap_in_cycles(gen: DVRGenerator) -> None:
    """What a caller's instrumentation does (tests/gpu/test_pass_order_cuda.py): wrap a part's method in a closure
    stored on that part, a cycle (part -> closure -> bound method -> part) refcounting never frees."""
    for part, name in ((gen.verifier, "launch"), (gen.fast_step, "read")):
        method = getattr(part, name)
        setattr(part, name, lambda *args, method=method, **kwargs: method(*args, **kwargs))


def test_close_drops_the_kv_while_a_cycle_still_holds_the_verifier_and_the_fast_path():
    gen = used_generator()
    _wrap_in_cycles(gen)
    kv = weakref.ref(gen.kv)
    k_v = [weakref.ref(t) for t in (*gen.kv._tensors.k, *gen.kv._tensors.v)]
    gc.collect()
    gc.disable()
    try:
        gen.close()
        assert kv() is not None, "vacuous: nothing holds the store any more, the cycle is not exercised"
        assert all(r() is None for r in k_v), "close() left the K/V to the garbage collector"
    finally:
        gc.enable()


def test_close_keeps_the_kv_of_a_store_it_was_handed(monkeypatch):
    """An injected store is the caller's (it may serve another generator): close() leaves its tensors. Negative
    control for the test above: without the release, the cycle keeps the generator's own store's K/V."""
    store = KVStore(CFG, num_blocks=64, block_size=8, num_scratch_slots=16, dtype=WEIGHTS.dtype)
    gen = DVRGenerator(WEIGHTS, CFG, window=4, group=2, kv_store=store)
    gen.generate([[5, 6, 7]], DET)
    gen.close()
    assert len(store._tensors.k) == CFG.num_layers and store.layers().k[0].numel() > 0
    monkeypatch.setattr(KVTensors, "release", lambda self: None)
    gen = used_generator()
    _wrap_in_cycles(gen)
    k_v = [weakref.ref(t) for t in gen.kv._tensors.k]
    gc.collect()
    gc.disable()
    try:
        gen.close()
        assert all(r() is not None for r in k_v)
    finally:
        gc.enable()
        gc.collect()


def test_context_manager_closes_on_exit_and_on_error():
    with DVRGenerator(WEIGHTS, CFG, window=4, group=2, kv_cache_tokens=512) as gen:
        out = gen.generate([[5, 6, 7]], DET)[0]
        assert len(out.token_ids) == 10
    assert gen.is_closed
    with pytest.raises(ZeroDivisionError):
        with DVRGenerator(WEIGHTS, CFG, window=4, group=2, kv_cache_tokens=512) as gen:
            gen.submit([5, 6, 7], DET)
            gen.step()
            raise ZeroDivisionError
    assert gen.is_closed


def test_close_while_a_stream_is_open_ends_the_stream_with_an_error():
    gen = DVRGenerator(WEIGHTS, CFG, window=4, group=2, kv_cache_tokens=512)
    stream = gen.stream([[5, 6, 7]], DET)
    next(stream)
    gen.close()
    with pytest.raises(RuntimeError, match="closed"):
        list(stream)


@pytest.mark.gpu
def test_deleting_a_cuda_generator_with_captured_graphs_frees_its_memory():
    """Build, use and drop a generator three times: device memory must not grow after the first.

    On the H200 (2026-12-01) it grew by 160 MiB per round (201326592, 369098752, 536870912 bytes)
    while every tensor of the generator died with it: each graph capture warmed up on a fresh
    stream, and cuBLAS keeps a workspace per stream. Warm-ups now share one stream per device
    (``llm42.cuda_graphs``); not yet re-run on CUDA.

    The first one may leave per-process state behind (cuBLAS workspaces per stream, Triton's
    compiled kernels), which is why the comparison starts after it; a cycle holding the K/V store,
    the weights or a graph pool would add its bytes at every round.
    """
    def allocated() -> int:
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated()

    after = []
    for _ in range(3):
        gc.collect()
        before = allocated()
        gen = used_generator("cuda")
        gen.generate([[1, 2, 3, 4] * 5], FREE)  # a fast prefill: its graphs are captured
        assert gen.fast_step.decode_graphs is not None and gen.fast_step.fast_prefill.graphs is not None
        assert allocated() > before
        box = [gen]
        del gen
        assert tensors_die_with(box), "a reference cycle keeps the generator's tensors alive"
        after.append(allocated())
    assert after[1] == after[0] and after[2] == after[0], after
