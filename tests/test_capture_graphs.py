"""``DVRGenerator.capture_graphs``: every CUDA graph captured before serving (``llm42 serve`` does it at start-up).

On the CPU there is nothing to capture: the counts are zero and nothing changes; the call is refused while a request
runs (its captures would stage padding rows over a step's). ``serve`` captures before the engine takes requests,
unless told not to. The captures themselves and the bits after them: tests/gpu/test_capture_graphs_cuda.py.
"""

from __future__ import annotations

import pytest

from llm42 import DVRGenerator, SamplingParams
from llm42.cli import build_parser
from llm42.model.weights import random_weights
from tests.helpers import tiny_config

CFG = tiny_config()
WEIGHTS = random_weights(CFG, seed=3)
DET = SamplingParams(max_new_tokens=6, deterministic=True, ignore_eos=True)
KINDS = {"decode": 0, "prefill": 0, "mixed": 0, "canonical": 0}


def test_on_the_cpu_nothing_is_captured_and_nothing_changes():
    plain = DVRGenerator(WEIGHTS, CFG, window=4, group=2, kv_cache_tokens=512)
    captured = DVRGenerator(WEIGHTS, CFG, window=4, group=2, kv_cache_tokens=512)
    assert captured.capture_graphs() == KINDS
    prompts = [[5, 6, 7], [8, 9, 10, 11]]
    assert ([c.token_ids for c in captured.generate(prompts, DET)]
            == [c.token_ids for c in plain.generate(prompts, DET)])


def test_refused_while_a_request_runs_then_allowed_once_all_finished():
    gen = DVRGenerator(WEIGHTS, CFG, window=4, group=2, kv_cache_tokens=512)
    rid = gen.submit([5, 6, 7], DET)
    gen.step()
    with pytest.raises(RuntimeError, match="idle generator"):
        gen.capture_graphs()
    while gen.has_unfinished():
        gen.step()
    assert len(gen.result(rid).token_ids) == 6
    assert gen.capture_graphs() == KINDS
    gen.close()
    with pytest.raises(RuntimeError, match="closed"):
        gen.capture_graphs()


@pytest.mark.parametrize("capture", [True, False])
def test_serve_captures_before_the_engine_takes_requests(monkeypatch, capture):
    pytest.importorskip("uvicorn")
    import uvicorn

    from llm42 import async_engine, server

    calls = []

    class Generator:
        def capture_graphs(self):
            calls.append("capture")
            return {"decode": 3, "prefill": 0, "mixed": 0, "canonical": 0}

    class Engine:
        def __init__(self, generator, *, max_pending):
            calls.append("engine")

        def close(self, drain_timeout=None):
            calls.append("close")

    monkeypatch.setattr(async_engine, "AsyncEngine", Engine)
    monkeypatch.setattr(server, "build_app", lambda engine, **kwargs: object())
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, *args, **kwargs: calls.append("run"))
    server.serve(Generator(), capture_graphs=capture, gc_freeze=False)
    assert calls == (["capture"] if capture else []) + ["engine", "run", "close"]


def test_the_cli_captures_unless_told_not_to():
    parser = build_parser()
    assert parser.parse_args(["serve"]).capture_graphs is True
    assert parser.parse_args(["serve", "--no-capture-graphs"]).capture_graphs is False
