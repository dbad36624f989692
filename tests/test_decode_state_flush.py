"""``DecodeState.flush`` sends every queued update in one packed copy (round 39): the device tensors it leaves are the
ones each queued update names, field by field, for any mix of updates, across a grown buffer and a reused one. Each
test runs on the CPU and, marked ``gpu``, on CUDA (the pinned buffer, its asynchronous copy and the event that keeps
a flush from overwriting a copy in flight)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from llm42 import SamplingParams
from llm42.engine.decode_state import DecodeState
from llm42.kv import KVStore
from llm42.model.weights import random_weights
from llm42.policies import FastPolicy
from tests.helpers import tiny_config

CFG = tiny_config()
FIELDS = ("tokens", "positions", "protect", "temperature", "top_p", "top_k", "seeds", "is_deterministic", "tables")
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _state(max_num_seqs: int, device: str) -> DecodeState:
    kv = KVStore(CFG, num_blocks=4 * max_num_seqs + 8, block_size=4, num_scratch_slots=max_num_seqs + 1,
                 device=device)
    return DecodeState(random_weights(CFG, seed=5, device=device), CFG, kv, FastPolicy(), max_num_seqs=max_num_seqs)


def _snapshot(state: DecodeState) -> dict[str, torch.Tensor]:
    return {name: getattr(state, name).cpu().clone() for name in FIELDS}


def _expected(state: DecodeState) -> dict[str, torch.Tensor]:
    """What the queued updates name, applied one by one on a copy of the device tensors."""
    return _apply_queued(_snapshot(state), state)


def _apply_queued(out: dict[str, torch.Tensor], state: DecodeState) -> dict[str, torch.Tensor]:
    """``out`` (host tensors) with ``state``'s queued updates applied one by one, in the order flush applies them:
    next tokens and positions, protect, sampling parameters, table entries. Reads nothing from the device."""
    for slot, (token, position) in state._next.items():
        out["positions"][slot] = position
        if token is not None:
            out["tokens"][slot] = token
    for slot, value in state._protect.items():
        out["protect"][slot] = value
    for slot, (temperature, top_k, top_p, seed, det) in state._params.items():
        out["temperature"][slot] = torch.tensor(temperature, dtype=torch.float32)  # float64 -> float32, nearest
        out["top_k"][slot] = top_k
        out["top_p"][slot] = torch.tensor(top_p, dtype=torch.float32)
        out["seeds"][slot] = seed
        out["is_deterministic"][slot] = det
    for row, col, block in state._table_writes:
        out["tables"][row, col] = block
    return out


def _queue(state: DecodeState, rng: random.Random, *, num_params: int) -> None:
    slots = list(range(state.max_num_seqs))
    for slot in rng.sample(slots, rng.randrange(len(slots) + 1)):
        state.set_next(slot, rng.choice([None, rng.randrange(CFG.vocab_size)]), rng.randrange(1, 500))
    for slot in rng.sample(slots, rng.randrange(len(slots) + 1)):
        state.set_protect(slot, rng.randrange(500))
    for slot in rng.sample(slots, num_params):
        params = SamplingParams(temperature=rng.choice([0.0, 0.1, 0.7, 1.3]), top_k=rng.randrange(50),
                                top_p=rng.choice([1.0, 0.9, 0.3]), deterministic=rng.random() < 0.5)
        state._params[slot] = (params.temperature, params.top_k, params.top_p, rng.randrange(2**62),
                               int(params.deterministic))
    # distinct entries: index_put_ leaves the value of a repeated index unspecified (flush never relied on it)
    cells = rng.sample([(row, col) for row in slots for col in range(state.max_blocks)], rng.randrange(3 * len(slots)))
    state._table_writes.extend((row, col, rng.randrange(64)) for row, col in cells)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", range(6))
def test_flush_leaves_each_queued_update_on_the_device(seed, device):
    rng = random.Random(seed)
    state = _state(max_num_seqs=6, device=device)
    changed = set()
    for round_ in range(4):  # the buffer reused flush after flush
        _queue(state, rng, num_params=rng.choice([0, 1, 3, 6]))  # odd counts: a float32 half-entry of padding
        before, expected = _snapshot(state), _expected(state)
        state.flush()
        for name in FIELDS:
            assert torch.equal(getattr(state, name).cpu(), expected[name]), (seed, round_, name)
            if not torch.equal(before[name], expected[name]):
                changed.add(name)
        assert not (state._next or state._protect or state._params or state._table_writes)
    assert {"positions", "protect", "tables"} <= changed, changed  # not vacuous: the updates moved the device state


@pytest.mark.parametrize("device", DEVICES)
def test_flush_grows_its_buffer_and_keeps_every_update(device):
    """More updates than the packed buffer first holds (1,024 entries): it grows, and every table entry lands."""
    state = _state(max_num_seqs=40, device=device)
    rng = np.random.default_rng(0)
    cells = rng.permutation(40 * state.max_blocks)[:900]
    state._table_writes.extend((int(c) // state.max_blocks, int(c) % state.max_blocks, int(b))
                               for c, b in zip(cells, rng.integers(0, 64, 900)))
    for slot in range(40):
        state.set_next(slot, slot + 1, slot + 2)
    expected = _expected(state)
    state.flush()
    assert state._updates._host.numel() > 1024
    for name in FIELDS:
        assert torch.equal(getattr(state, name).cpu(), expected[name]), name


@pytest.mark.parametrize("device", DEVICES)
def test_flush_rounds_floats_as_torch_tensor_does(device):
    """The sampling floats are packed as float32 in int64 entries: each one's bits are float32's nearest value of the
    Python float, as ``torch.tensor(..., dtype=torch.float32)`` gives, and the next field's values are not touched by
    the padding half of an odd count."""
    state = _state(max_num_seqs=3, device=device)
    values = (0.1, 1.0 / 3.0, 2.0 ** -30 + 1.0)
    for slot, temperature in enumerate(values):
        state._params[slot] = (temperature, 7 + slot, 1.0 - temperature / 4, 11 + slot, slot % 2)
    state.flush()
    assert torch.equal(state.temperature[:3].cpu(), torch.tensor(values, dtype=torch.float32))
    assert torch.equal(state.top_p[:3].cpu(), torch.tensor([1.0 - v / 4 for v in values], dtype=torch.float32))
    assert state.top_k[:3].tolist() == [7, 8, 9] and state.seeds[:3].tolist() == [11, 12, 13]
    assert state.is_deterministic[:3].tolist() == [0, 1, 0]


@pytest.mark.parametrize("device", DEVICES)
def test_back_to_back_flushes_keep_both(device):
    """Two flushes with nothing waiting between them (on CUDA the first copy may still be in flight when the second
    packs the buffer): the device ends with the first's updates where the second left them and the second's elsewhere."""
    state = _state(max_num_seqs=40, device=device)
    rng = random.Random(11)
    expected = _snapshot(state)  # the last device read before the flushes
    for _ in range(2):
        _queue(state, rng, num_params=rng.choice([5, 40]))
        _apply_queued(expected, state)  # on the host mirror: nothing waits for the device between the flushes
        state.flush()
    for name in FIELDS:
        assert torch.equal(getattr(state, name).cpu(), expected[name]), name
