"""``llm42.gc_freeze.frozen_gc``: while a block runs, the objects that existed when it started are out of the cyclic
collector's passes (``gc.freeze``); at its end they are back (and collected), also when the block raises; nested
blocks share the outermost freeze. The benchmarks' runs take it as a knob (``Engine(gc_freeze=True)``, what ``llm42
serve`` does while serving): the timed steps run frozen, the committed tokens are the same. What it saves (a full
collection's pause) is a timing, measured by ``benchmarks/cpu_gc_pauses.py``, not here."""

from __future__ import annotations

import gc
import math
import weakref

import pytest
import torch

from llm42.bench import Engine, build_model, fixed_shape, run_offline, run_online
from llm42.bench import runner as runner_module
from llm42.bench.modes import mode_by_name
from llm42.cli import build_parser
from llm42.gc_freeze import frozen_gc


def test_objects_of_before_the_block_are_frozen_during_it_and_back_after():
    assert gc.get_freeze_count() == 0
    kept = [[i] for i in range(1000)]  # tracked objects that exist when the block starts
    with frozen_gc():
        assert gc.get_freeze_count() >= len(kept)
        with frozen_gc():  # nested: the outer freeze holds, the inner end unfreezes nothing
            pass
        assert gc.get_freeze_count() >= len(kept)
    assert gc.get_freeze_count() == 0
    with frozen_gc(False):  # the switch off: the control, nothing frozen
        assert gc.get_freeze_count() == 0


def test_a_block_that_raises_still_unfreezes():
    with pytest.raises(RuntimeError, match="boom"):
        with frozen_gc():
            assert gc.get_freeze_count() > 0
            raise RuntimeError("boom")
    assert gc.get_freeze_count() == 0


def _cycle():
    class Node:
        pass

    node = Node()
    node.self = node  # a cycle: only the cyclic collector frees it
    return node, weakref.ref(node)


def test_cycles_made_garbage_while_frozen_are_collected_after_the_block():
    node, ref = _cycle()
    with frozen_gc():
        del node  # garbage now, but frozen: a collection inside the block leaves it
        gc.collect()
        assert ref() is not None
    assert ref() is None  # unfrozen and collected at the block's end
    node, ref = _cycle()  # the control: not frozen, a collection frees it
    del node
    gc.collect()
    assert ref() is None


@pytest.mark.parametrize("online", [False, True])
def test_a_benchmark_run_with_gc_freeze_steps_frozen_and_commits_the_same_tokens(monkeypatch, online):
    workload = fixed_shape(8, 6, 3, length_scale=1.0, vocab_size=512, seed=2)
    model = build_model("tiny", device=torch.device("cpu"), dtype=torch.float32, max_positions=64)
    counts: list[int] = []
    step = runner_module._Tracker.step

    def counting(self, t0):
        counts.append(gc.get_freeze_count())
        return step(self, t0)

    monkeypatch.setattr(runner_module._Tracker, "step", counting)
    outputs = {}
    for freeze in (False, True):
        counts.clear()
        engine = Engine(model, window=4, group=2, kv_cache_tokens=512, gc_freeze=freeze)
        if online:
            run = run_online(engine, workload, mode_by_name("dvr@50"), [0.0] * workload.num_requests,
                             det_order=[0, 1, 2], deadline=math.inf)
        else:
            run = run_offline(engine, workload, mode_by_name("dvr@50"), det_order=[0, 1, 2], deadline=math.inf)
        assert run.is_complete and counts
        assert all(c > 0 for c in counts) if freeze else all(c == 0 for c in counts)
        assert gc.get_freeze_count() == 0
        outputs[freeze] = {r.index: r.token_ids for r in run.records}
    assert outputs[True] == outputs[False]


def test_serve_freezes_unless_told_not_to():
    parser = build_parser()
    assert parser.parse_args(["serve"]).gc_freeze is True
    assert parser.parse_args(["serve", "--no-gc-freeze"]).gc_freeze is False
