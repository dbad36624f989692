"""benchmarks/device/batched_passes.py's ``BatchedPassScheduler``: verify-only passes held until their windows fill
``min_rows`` rows, a due window has waited ``max_wait`` steps, or every drafting deterministic request's window
together could not fill them. Scheduling never changes a committed bit: the same requests served with it and with
the default scheduler commit the same tokens and log-probs, with passes held back (so the comparison is not
vacuous: it did schedule otherwise) and no more passes than the default formed. Passes run synchronously (no
``canonical_thread``), so what the scheduler sees, and so the test, does not depend on timing.
"""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

from llm42 import DVRGenerator, SamplingParams
from llm42.model.weights import random_weights
from llm42.scheduler import DefaultScheduler
from llm42.testing import strategies as ls
from tests.helpers import run_dvr_ab, serve

DEVICE_DIR = Path(__file__).resolve().parents[1] / "benchmarks" / "device"
CFG = ls.wide_model_config(vocab_size=256, max_position_embeddings=256)
WEIGHTS = random_weights(CFG, seed=3)


def _module():
    sys.path.insert(0, str(DEVICE_DIR))
    spec = importlib.util.spec_from_file_location("batched_passes", DEVICE_DIR / "batched_passes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_held_passes_commit_the_default_schedulers_bits_in_fewer_passes():
    batched = _module().batched(48, 6)
    rng = random.Random(5)
    prompts = [[rng.randrange(3, 256) for _ in range(rng.randint(3, 30))] for _ in range(16)]
    params = [SamplingParams(max_new_tokens=rng.randint(10, 60), deterministic=i % 2 == 0, logprobs=True,
                             ignore_eos=True, temperature=0.0 if i % 4 < 2 else 0.9, seed=i) for i in range(16)]
    runs = {}
    for name, scheduler in (("default", DefaultScheduler()), ("batched", batched())):
        gen = DVRGenerator(WEIGHTS, CFG, window=6, group=4, max_num_seqs=16, max_fast_tokens=96,
                           max_canonical_tokens=96, scheduler=scheduler)
        runs[name] = (serve(gen, prompts, params), gen.stats["canonical_passes"], scheduler)
    (default, default_passes, _), (held, held_passes, scheduler) = runs["default"], runs["batched"]
    for i in range(0, 16, 2):
        assert held[i].token_ids == default[i].token_ids and held[i].logprobs == default[i].logprobs
    assert scheduler.num_held > 0
    assert held_passes <= default_passes


def test_dvr_ab_serves_the_batched_gemm_rows_variant_with_its_configs_outputs(tmp_path, monkeypatch):
    """The benchmark's ``gemm_rows_1024_batched`` (the next A/B on a GPU) end to end on the CPU: it commits the
    outputs of ``gemm_rows_1024`` (its canonical config: the contract check compares them) with the batched
    scheduler in place."""
    got = run_dvr_ab(tmp_path / "ab.json", monkeypatch, "gemm_rows_1024,gemm_rows_1024_batched")
    (check,) = got["deterministic_outputs_identical"].values()
    assert check["num_checked"] > 0 and check["num_identical"] == check["num_checked"]
    assert got["variants"]["gemm_rows_1024_batched"] == {"canonical_gemm_rows": 1024, "scheduler": "batched_1024_8"}
