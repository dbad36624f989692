"""``llm42 doctor``: it passes on the embedded model on the CPU, and it catches broken premises.

Negative controls: a canonical policy whose RMSNorm reads a statistic of the
whole batch, one whose GEMM sums rows in a different order depending on where
they sit, and one whose logits differ from process to process must each make
doctor fail, naming that op and its shape (and nothing else).
"""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.nn.functional as F

from llm42 import DVRGenerator, cli
from llm42.doctor import run_doctor
from llm42.policies import FixedShapePolicy
from tests.helpers import tiny_config

OP_CHECKS = ("linear[qkv]", "linear[o_proj]", "linear[gate_up]", "linear[down]", "linear[lm_head]", "rms_norm",
             "add_rms_norm", "rope_and_store", "swiglu", "attention[context 7]", "attention[context 130]",
             "sample[greedy]", "sample[top-k]", "sample[top-p]", "canonical pass")
LINEARS = tuple(op for op in OP_CHECKS if op.startswith("linear"))


class BatchStatisticNormPolicy(FixedShapePolicy):
    """RMSNorm whose epsilon grows with the mean square of the whole batch: a row depends on the others."""

    def rms_norm(self, x, weight, eps):
        h = x.float()
        batch_eps = eps + 1e-3 * h.pow(2).mean()  # the bug under test: a reduction across rows
        return weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + batch_eps)).to(x.dtype)


class BatchSizeEpsNormPolicy(FixedShapePolicy):
    """RMSNorm with an epsilon that depends on the number of rows only: harmless at a fixed R."""

    def rms_norm(self, x, weight, eps):
        return super().rms_norm(x, weight, eps * (1 + x.shape[0] / 8))


class RowTiledLinearPolicy(FixedShapePolicy):
    """A GEMM that sums the second half of the rows in another order (two K halves), as a kernel whose
    tile schedule depends on the row index would: position-dependent at a fixed shape."""

    def linear(self, x, weight, bias=None):
        half, k = x.shape[0] // 2, x.shape[-1] // 2
        tail = F.linear(x[half:, :k], weight[:, :k]) + F.linear(x[half:, k:], weight[:, k:])
        if bias is not None:
            tail = tail + bias
        return torch.cat([F.linear(x[:half], weight, bias), tail])


class ProcessOffsetPolicy(FixedShapePolicy):
    """Logits shifted by a constant that is a function of the process id: the same in every row of one
    process (so position-invariant), different in another process."""

    def process_logits(self, logits, inputs):
        return logits + 1e-3 * (os.getpid() % 997 + 1)


class TileMateAttentionPolicy(FixedShapePolicy):
    """Attention whose rows see how many rows share their block table: a tiled kernel whose bits depend on
    which rows share a tile. One row per sequence never shows it; rows of one sequence side by side do."""

    def attention(self, q, k_cache, v_cache, inputs, **kwargs):
        out = super().attention(q, k_cache, v_cache, inputs, **kwargs)
        shared = inputs.shared_table_rows
        num_mates = (shared[:, None] == shared[None, :]).sum(dim=1)
        return out + 1e-3 * num_mates.to(out.dtype)[:, None, None]


def failed_ops(report) -> set[str]:
    return {c.op for c in report.failures}


def test_doctor_passes_on_the_embedded_model_on_the_cpu(capsys, tmp_path):
    """With the command's defaults: the generator's canonical size for the CPU."""
    path = tmp_path / "doctor.json"
    code = cli.main(["doctor", "--json", str(path)])
    out = capsys.readouterr().out
    assert code == cli.EXIT_OK, out
    report = json.loads(path.read_text())
    assert report["is_ok"] and report["failures"] == []
    config = report["config"]
    assert config["num_rows"] == config["window"] * config["group"] and config["policy"].startswith("FixedShape")
    assert out.strip().splitlines()[-1].startswith(f"PASS: every premise held on cpu at R = {config['num_rows']}")
    position = [c["op"] for c in report["checks"] if c["premise"] == "position"]
    assert position == list(OP_CHECKS)
    (process,) = [c for c in report["checks"] if c["premise"] == "process"]
    assert process["is_ok"] and process["error"] == ""
    assert all(c["num_placements"] >= 12 for c in report["checks"] if c["premise"] == "position"
               and c["op"] != "canonical pass")
    drift = {i["op"]: i for i in report["info"] if i["topic"] == "fast_drift"}
    assert set(drift) == {*LINEARS, "forward"} and drift["forward"]["num_tried"] == 11
    for line in ("premise 1:", "premise 2:", "linear[down]", "fast path (FastPolicy()) drift"):
        assert line in out


def test_a_norm_that_reads_the_whole_batch_fails_doctor_naming_rms_norm_and_its_shape():
    report = run_doctor(policy=BatchStatisticNormPolicy(), window=4, group=4, check_processes=False,
                        check_fast_drift=False)
    assert not report.is_ok
    # the row ops may call the policy's rms_norm (TorchRowOps does); no GEMM, attention or sampler breaks
    assert {"rms_norm", "canonical pass"} <= failed_ops(report) <= {"rms_norm", "add_rms_norm", "rope_and_store",
                                                                    "canonical pass"}
    (norm,) = [c for c in report.failures if c.op == "rms_norm"]
    assert norm.shape == "[16, 64]" and norm.num_distinct > 1
    assert any("random rows" in d for d in norm.differing)
    last = report.format().splitlines()[-1]
    assert last.startswith(f"FAIL: {len(report.failures)} of 15 checks") and "rms_norm at [16, 64]" in last


def test_a_position_dependent_linear_fails_doctor_naming_each_linear_and_its_shape():
    report = run_doctor(policy=RowTiledLinearPolicy(), window=4, group=4, check_processes=False,
                        check_fast_drift=False)
    assert failed_ops(report) == {*LINEARS, "canonical pass"}
    by_op = {c.op: c for c in report.failures}
    assert by_op["linear[down]"].shape == "[16, 172] x [64, 172]^T"
    assert by_op["linear[lm_head]"].shape == "[16, 64] x [512, 64]^T"
    # the second half of the rows is summed differently: the probe differs there, among every filler
    assert by_op["linear[qkv]"].differing[-1] == "row 15 among zero rows / random rows / copies of the probe"
    assert "linear[qkv] at [16, 64] x [128, 64]^T" in report.format()


def test_attention_whose_bits_depend_on_its_tile_mates_fails_doctor():
    report = run_doctor(policy=TileMateAttentionPolicy(), window=4, group=4, check_processes=False,
                        check_fast_drift=False)
    assert {"attention[context 7]", "attention[context 130]"} <= failed_ops(report)
    by_op = {c.op: c for c in report.failures}
    assert any("random rows" in d for d in by_op["attention[context 130]"].differing)


def test_doctor_on_a_generator_whose_max_model_len_cut_its_tables():
    """The probes' positions stay within the generator's RoPE tables (max_model_len rows, not the context)."""
    gen = DVRGenerator.from_config(tiny_config(vocab_size=512, max_position_embeddings=512), window=4, group=2,
                                   kv_cache_tokens=256, max_model_len=64)
    assert gen.weights.rope_cos.shape[0] == 64
    report = run_doctor(gen, check_processes=False, check_fast_drift=False)
    assert report.is_ok, report.format()


def test_a_batch_size_dependent_epsilon_is_information_not_a_failure():
    """At a fixed R the canonical pass never changes its row count, so only N-invariance sees it."""
    report = run_doctor(policy=BatchSizeEpsNormPolicy(), window=4, group=4, check_processes=False,
                        check_fast_drift=False)
    assert report.is_ok
    n_inv = {i.op: i.num_distinct for i in report.info if i.topic == "n_invariance"}
    assert n_inv["rms_norm"] == 2 and n_inv["swiglu"] == 1


def test_logits_that_differ_between_processes_fail_the_second_process_check():
    """Also runs the second process on a generator's in-memory weights (no checkpoint to reload)."""
    gen = DVRGenerator.from_config(tiny_config(vocab_size=512), window=4, group=2,
                                   canonical_policy=ProcessOffsetPolicy(), kv_cache_tokens=256)
    report = run_doctor(gen, check_fast_drift=False)
    (process,) = [c for c in report.checks if c.premise == "process"]
    assert process.error == "" and not process.is_ok
    assert "logits" in process.differing and "kv" not in process.differing  # K/V is written before
    assert report.config["num_rows"] == 8 and report.config["policy"].startswith("ProcessOffsetPolicy")
    assert "FAIL: the second process's logits" in report.format()


def test_an_unpicklable_policy_needs_check_processes_false():
    class LocalPolicy(FixedShapePolicy):  # a local class does not pickle
        pass

    with pytest.raises(ValueError, match="check_processes=False"):
        run_doctor(policy=LocalPolicy(), window=2, group=1)


@pytest.mark.parametrize("argv, message", [
    (["--window", "0"], "window must be >= 1"),
    (["--model", "/nonexistent/checkpoint"], "does not exist"),
])
def test_doctor_usage_errors_exit_2(capsys, argv, message):
    code = cli.main(["doctor", *argv])
    err = capsys.readouterr().err
    assert code == cli.EXIT_USAGE and err.startswith("llm42 doctor: error:") and message in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error where CUDA is missing")
def test_doctor_on_cuda_without_cuda_is_a_usage_error(capsys):
    assert cli.main(["doctor", "--device", "cuda"]) == cli.EXIT_USAGE
    assert "CUDA is not available" in capsys.readouterr().err


def test_help_lists_doctor_and_its_options(capsys):
    assert cli.main(["--help"]) == cli.EXIT_OK
    assert "doctor" in capsys.readouterr().out
    assert cli.main(["doctor", "--help"]) == cli.EXIT_OK
    out = capsys.readouterr().out
    for option in ("--model", "--device", "--window", "--group", "--json", "--seed", "--threads"):
        assert option in out
