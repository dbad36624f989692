"""Tensor parallelism at TP = 2: two gloo processes on the CPU, against TP = 1 in this process.

One job (``tests/tp_jobs.py``, both ranks) runs every TP = 2 scenario once;
the tests below each check one property of its results:

- the row-parallel canonical GEMM (global scales, float64 all-reduce of exact
  partial products) gives the bits of the one-rank exact GEMM, for any rows;
- the canonical pass at TP = 2 commits TP = 1's bits (TP-size invariance):
  tokens and log-probs of deterministic requests run alone, and ``score``;
- the contract at TP = 2: each deterministic request in random batches with
  a noisy fast path (rollbacks forced) commits what it commits alone;
- the ranks agree with each other bit for bit;
- negative control: a float32 all-reduce of partial ``F.linear`` outputs gives
  other bits than TP = 1, and so fails the TP-invariance check.
"""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from llm42 import DVRGenerator, SamplingParams
from llm42.distributed import RendezvousError, launch, shard_config
from llm42.model.loader import embedded_model_path, load_config
from llm42.ops import exact

from . import tp_jobs

# the module (the package's ``launch`` is its function of that name)
launch_module = importlib.import_module("llm42.distributed.launch")

NUM_BATCHES, SEED = 2, 3


@pytest.fixture(scope="module")
def biased_checkpoint(tmp_path_factory) -> Path:
    return tp_jobs.write_biased_checkpoint(tmp_path_factory.mktemp("biased"))


@pytest.fixture(scope="module")
def ranks(biased_checkpoint) -> list[dict]:
    return launch(tp_jobs.rank_job, NUM_BATCHES, SEED, biased_checkpoint, tensor_parallel=2, backend="gloo",
                  num_threads=1, timeout_s=240)


@pytest.fixture(scope="module")
def tp1(biased_checkpoint) -> dict:
    gen = DVRGenerator.from_pretrained(window=tp_jobs.WINDOW, group=tp_jobs.GROUP)
    alone = [gen.generate([p], q)[0] for p, q in zip(tp_jobs.TARGET_PROMPTS, tp_jobs.TARGET_PARAMS)]
    score = gen.score([tp_jobs.SCORE_PROMPT], [tp_jobs.SCORE_COMPLETION], SamplingParams(max_new_tokens=1))[0]
    biased = DVRGenerator.from_pretrained(biased_checkpoint, window=tp_jobs.WINDOW, group=tp_jobs.GROUP)
    completion = biased.generate([tp_jobs.BIASED_PROMPT], tp_jobs.BIASED_PARAMS)[0]
    return {"alone": [(c.token_ids, c.logprobs) for c in alone], "score": score,
            "biased": (completion.token_ids, completion.logprobs)}


def _bits(values: list[float]) -> list[bytes]:
    return [torch.tensor(v, dtype=torch.float64).numpy().tobytes() for v in values]


def test_sharded_exact_linear_equals_whole_exact_linear_bits(ranks):
    x, weight, bias = tp_jobs.op_operands()
    whole = exact.linear(x, weight, bias, slices=exact.WeightSlices())
    for rank in ranks:
        assert torch.equal(rank["ops"]["sharded"], whole)
        assert torch.equal(rank["ops"]["sharded_tail"], whole[5:9])  # a row's bits are its own at TP = 2 too


def test_ordered_sum_gives_a_row_its_own_bits(ranks):
    assert all(rank["ops"]["ordered_is_row_local"] for rank in ranks)


def test_canonical_pass_commits_tp1_bits_at_tp2(ranks, tp1):
    for rank in ranks:
        for (tokens, logprobs), (ref_tokens, ref_logprobs) in zip(rank["alone"], tp1["alone"]):
            assert tokens == ref_tokens
            assert _bits(logprobs) == _bits(ref_logprobs)
        assert _bits(rank["score"]) == _bits(tp1["score"])


def test_biases_tied_embeddings_and_padded_vocab_shard_without_changing_bits(ranks, tp1):
    ref_tokens, ref_logprobs = tp1["biased"]
    assert len(set(ref_tokens)) > 1  # the random model does not just repeat one token
    for rank in ranks:
        tokens, logprobs = rank["biased"]
        assert tokens == ref_tokens and _bits(logprobs) == _bits(ref_logprobs)


def test_contract_at_tp2_alone_vs_random_batches_with_rollbacks(ranks):
    for rank in ranks:
        assert rank["divergences"] == []
        assert rank["rollbacks"] > 0, "the noisy fast path forced no rollback: the check proved nothing"
        assert rank["free_requests"] > 0


def test_ranks_agree_bit_for_bit(ranks):
    first, second = ranks
    assert first["alone"] == second["alone"] and _bits(first["score"]) == _bits(second["score"])
    assert torch.equal(first["ops"]["sharded"], second["ops"]["sharded"])


def test_naive_float32_all_reduce_breaks_tp_invariance(ranks, tp1):
    """Negative control: the check above catches a reduction whose rounding follows the split."""
    x, weight, bias = tp_jobs.op_operands()
    naive = ranks[0]["ops"]["naive"]
    assert not torch.equal(naive, exact.linear(x, weight, bias, slices=exact.WeightSlices()))
    assert not torch.equal(naive, F.linear(x, weight, bias))
    assert _bits(ranks[0]["naive_score"]) != _bits(tp1["score"])


def test_tensor_parallel_needs_a_process_group():
    with pytest.raises(ValueError, match="process group"):
        DVRGenerator.from_pretrained(tensor_parallel=2)


@pytest.mark.parametrize("bad", [0, -1, True, 2.0])
def test_tensor_parallel_must_be_a_positive_int(bad):
    with pytest.raises(ValueError, match="tensor_parallel"):
        DVRGenerator.from_pretrained(tensor_parallel=bad)


def test_tensor_parallel_must_divide_kv_heads_and_ffn():
    cfg = load_config(embedded_model_path())  # 4 kv heads, FFN 172
    assert shard_config(cfg, 2).num_kv_heads == 2
    with pytest.raises(ValueError, match="num_key_value_heads"):
        shard_config(cfg, 8)
    with pytest.raises(ValueError, match="intermediate_size"):
        shard_config(dataclasses.replace(cfg, intermediate_size=170), 4)


def test_launch_raises_a_failing_ranks_traceback():
    with pytest.raises(RuntimeError, match=r"(?s)rank 1 failed.*ValueError: rank 1 was told to fail"):
        launch(tp_jobs.raise_on_rank, 1, tensor_parallel=2, backend="gloo", num_threads=1, timeout_s=120)


def test_launch_starts_a_job_again_when_its_ranks_cannot_form_a_group(monkeypatch):
    attempts = []

    def flaky(*args):
        attempts.append(args)
        if len(attempts) < launch_module.RENDEZVOUS_ATTEMPTS:
            raise RendezvousError("rank 1 could not join the process group: connection closed by peer")
        return [0, 1]

    monkeypatch.setattr(launch_module, "_launch_once", flaky)
    assert launch(tp_jobs.raise_on_rank, 1, tensor_parallel=2, backend="gloo") == [0, 1]
    assert len(attempts) == launch_module.RENDEZVOUS_ATTEMPTS


def test_a_rendezvous_that_always_fails_is_raised_after_the_last_attempt():
    # a real one: NCCL ranks on a machine without CUDA fail while joining the group, before the job runs
    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA (NCCL's rendezvous fails there)")
    with pytest.raises(RendezvousError, match=rf"(?s){launch_module.RENDEZVOUS_ATTEMPTS} attempts failed.*"
                                              r"could not join the process group"):
        launch(tp_jobs.raise_on_rank, 0, tensor_parallel=1, backend="nccl", num_threads=1, timeout_s=120)


def test_a_job_that_raises_is_not_started_again(tmp_path):
    # negative control of the retries: only a failed rendezvous starts a job again, never the job's own error
    runs = tmp_path / "runs"
    with pytest.raises(RuntimeError, match="told to fail"):
        launch(tp_jobs.count_and_raise, str(runs), tensor_parallel=1, backend="gloo", num_threads=1, timeout_s=120)
    assert runs.read_text() == "ran\n"


def test_launch_rejects_bad_arguments():
    with pytest.raises(ValueError, match="tensor_parallel"):
        launch(tp_jobs.raise_on_rank, 1, tensor_parallel=0)
    with pytest.raises(ValueError, match="backend"):
        launch(tp_jobs.raise_on_rank, 1, tensor_parallel=2, backend="mpi")
