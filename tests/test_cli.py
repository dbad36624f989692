"""The ``llm42`` command line: every subcommand, its output, and its error paths.

Most tests call ``llm42.cli.main([...])`` in-process (importing torch and the
tokenizer once); two run the real entry points in a subprocess.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import types
from itertools import count
from pathlib import Path

import pytest
import torch

from llm42 import DefaultScheduler, DVRGenerator, SamplingParams, cli
from llm42.model import embedded_model_path
from llm42.policies import FixedShapePolicy

SMALL = ["--window", "4", "--group", "2"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}



def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def no_tokenizer_checkpoint(tmp_path_factory) -> Path:
    """The embedded model without its tokenizer files: prompts must be token ids."""
    path = tmp_path_factory.mktemp("no_tokenizer")
    for name in ("config.json", "model.safetensors"):
        shutil.copy(embedded_model_path() / name, path / name)
    return path


class DriftingCanonicalPolicy(FixedShapePolicy):
    """A canonical policy that lies: shape-closed in name, but each instance adds its own noise.

    Two generators built with different seeds disagree, as a canonical pass
    with a batch-dependent reduction would; the CLI must report it.
    """

    def __init__(self, seed: int):
        super().__init__()
        self._generator = torch.Generator().manual_seed(seed)

    def process_logits(self, logits, inputs):
        noise = torch.randn(logits.shape, generator=self._generator)
        return logits + 3.0 * logits.std(dim=-1, keepdim=True) * noise


@pytest.fixture
def drifting_canonical_pass(monkeypatch):
    seeds = count()

    class DriftingGenerator(DVRGenerator):
        # however the CLI builds its generators (from_pretrained, or over a checkpoint loaded once)
        def __init__(self, *args, **kwargs):
            super().__init__(*args, canonical_policy=DriftingCanonicalPolicy(next(seeds)), **kwargs)

    monkeypatch.setattr(cli, "DVRGenerator", DriftingGenerator)


# -- generate -----------------------------------------------------------------------------------------
def test_generate_prints_one_json_line_per_prompt_matching_the_library(capsys):
    prompts = ["Once upon a time", "The little dog"]
    code, out, _ = run_cli(capsys, "generate", *prompts, "--deterministic", "--logprobs", "--max-new-tokens", "6",
                           "--temperature", "0.8", "--top-p", "0.9", "--seed", "5", *SMALL)
    assert code == 0
    records = [json.loads(line) for line in out.splitlines()]
    assert [r["prompt"] for r in records] == prompts
    params = SamplingParams(max_new_tokens=6, temperature=0.8, top_p=0.9, seed=5, deterministic=True, logprobs=True)
    expected = DVRGenerator.from_pretrained(window=4, group=2).generate(prompts, params)
    for record, completion in zip(records, expected):
        assert set(record) == {"prompt", "text", "token_ids", "finish_reason", "logprobs", "num_rollbacks",
                               "num_recomputed"}
        assert record["token_ids"] == completion.token_ids
        assert record["logprobs"] == completion.logprobs
        assert record["text"] == completion.text
        assert record["finish_reason"] == completion.finish_reason


@pytest.mark.parametrize("extra", [("--max-model-len", "64"), ("--canonical-thread",)])
def test_generate_with_engine_knobs_commits_what_the_defaults_do(capsys, extra):
    code, out, _ = run_cli(capsys, "generate", "Once upon a time", "--deterministic", "--logprobs",
                           "--max-new-tokens", "6", *extra, *SMALL)
    assert code == 0
    record = json.loads(out)
    params = SamplingParams(max_new_tokens=6, deterministic=True, logprobs=True)
    expected = DVRGenerator.from_pretrained(window=4, group=2).generate(["Once upon a time"], params)[0]
    assert (record["token_ids"], record["logprobs"]) == (expected.token_ids, expected.logprobs)


def test_generate_reads_prompts_from_a_file_and_stdin(capsys, tmp_path, monkeypatch):
    prompts_file = tmp_path / "prompts.txt"
    prompts_file.write_text("Once upon a time\n\nThe cat\n")
    code, out, _ = run_cli(capsys, "generate", "--file", str(prompts_file), "--max-new-tokens", "3", "--ignore-eos")
    assert code == 0
    records = [json.loads(line) for line in out.splitlines()]
    assert [r["prompt"] for r in records] == ["Once upon a time", "The cat"]  # blank lines skipped
    assert all(r["logprobs"] is None and len(r["token_ids"]) == 3 for r in records)

    monkeypatch.setattr(sys, "stdin", io.StringIO("One day\n"))
    code, out, _ = run_cli(capsys, "generate", "First", "--file", "-", "--max-new-tokens", "2")
    assert code == 0
    assert [json.loads(line)["prompt"] for line in out.splitlines()] == ["First", "One day"]


def test_generate_token_ids_on_a_checkpoint_without_tokenizer(capsys, no_tokenizer_checkpoint):
    code, out, _ = run_cli(capsys, "generate", "--model", str(no_tokenizer_checkpoint), "--token-ids",
                           "1 403 407", "1,261", "--max-new-tokens", "4", "--ignore-eos")
    assert code == 0
    records = [json.loads(line) for line in out.splitlines()]
    assert [r["prompt"] for r in records] == [[1, 403, 407], [1, 261]]
    assert all(r["text"] is None and len(r["token_ids"]) == 4 for r in records)


# -- error paths: exit status 2, one message line, no traceback ---------------------------------------
def _checkpoint_dir(parent: Path, name: str, config: dict | None) -> Path:
    path = parent / name
    path.mkdir()
    if config is not None:
        (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["generate", "x", "--model", "/no/such/checkpoint"], "does not exist"),
        (["generate", "x", "--top-p", "1.5"], "SamplingParams.top_p must be in (0, 1], got 1.5"),
        (["generate", "x", "--top-p", "0"], "SamplingParams.top_p must be in (0, 1]"),
        (["generate", "x", "--temperature", "-1"], "SamplingParams.temperature"),
        (["generate", "x", "--top-k", "-2"], "SamplingParams.top_k must be >= 0"),
        (["generate", "x", "--max-new-tokens", "0"], "SamplingParams.max_new_tokens must be >= 1"),
        (["generate", "x", "--max-new-tokens", "600"], "exceeds the model's context of 512 tokens"),
        (["generate", "x", "--max-model-len", "0"], "max_model_len must be a positive integer"),
        (["generate", "x", "--max-model-len", "600"], "max_model_len (600) exceeds the model's context of 512"),
        (["generate", "x", "--max-model-len", "16", "--max-new-tokens", "20"], "exceeds max_model_len, 16 tokens"),
        (["generate", "x", "--window", "0"], "window must be >= 1"),
        (["generate", "x", "--group", "0"], "group must be >= 1"),
        (["generate", "x", "--device", "nonsense"], "invalid device"),
        (["generate", "x", "--seed", "1.5"], "invalid int value"),
        (["generate"], "no prompts"),
        (["generate", "--file", "/no/such/prompts.txt"], "cannot read prompt file"),
        (["generate", "--token-ids", "1 2 x"], "is not a list of integers"),
        (["generate", "--token-ids", "1 2 9999"], "outside [0, 512)"),
        (["check", "--num-batches", "0"], "--num-batches must be >= 1"),
        (["check", "--noisy", "--noise-scale", "0"], "--noise-scale must be > 0"),
        (["check", "--model", "/no/such/checkpoint"], "does not exist"),
        (["demo", "--noise-scale", "0"], "--noise-scale must be > 0"),
        (["generate", "x", "--threads", "0"], "--threads must be >= 1"),
        (["demo", "--window", "-3"], "window must be >= 1"),
        (["frobnicate"], "invalid choice"),
        (["generate", "x", "--frobnicate"], "unrecognized arguments: --frobnicate"),
    ],
)
def test_bad_input_exits_2_with_a_clear_message(capsys, argv, message):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert message in err
    assert "Traceback" not in err and out == ""


def test_bad_checkpoints_exit_2_naming_the_problem(capsys, tmp_path):
    empty = _checkpoint_dir(tmp_path, "empty", None)
    code, _, err = run_cli(capsys, "generate", "x", "--model", str(empty))
    assert code == 2 and "has no config.json" in err

    gpt2 = _checkpoint_dir(tmp_path, "gpt2", {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"})
    code, _, err = run_cli(capsys, "check", "--model", str(gpt2))
    assert code == 2 and "unsupported architecture" in err

    code, _, err = run_cli(capsys, "generate", "x", "--model", str(embedded_model_path() / "config.json"))
    assert code == 2 and "is not a directory" in err


def test_text_prompt_without_tokenizer_exits_2(capsys, no_tokenizer_checkpoint):
    code, _, err = run_cli(capsys, "generate", "hello", "--model", str(no_tokenizer_checkpoint))
    assert code == 2 and "--token-ids" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_cuda_device_without_cuda_exits_2(capsys):
    code, _, err = run_cli(capsys, "generate", "x", "--device", "cuda")
    assert code == 2 and "CUDA is not available" in err


# -- demo -----------------------------------------------------------------------------------------------
def test_demo_passes_and_shows_rollbacks_repaired(capsys):
    code, out, _ = run_cli(capsys, "demo", "--num-batches", "1", "--max-new-tokens", "10", *SMALL)
    assert code == 0
    assert "'Once upon a time' -> '" in out  # the texts are printed
    assert "FAIL" not in out
    verdict = out.strip().splitlines()[-1]
    assert verdict.startswith("PASS: 3 deterministic requests gave bit-identical tokens and log-probs")
    repaired = int(verdict.split("fast path's ")[1].split()[0])
    assert repaired > 0
    assert "noisy    steps=" in out


def test_demo_fails_with_exit_1_when_outputs_differ(capsys, drifting_canonical_pass):
    code, out, _ = run_cli(capsys, "demo", "--num-batches", "1", "--max-new-tokens", "6", *SMALL)
    assert code == 1
    assert "MISMATCH" in out
    assert out.strip().splitlines()[-1].startswith("FAIL:")


# -- check ----------------------------------------------------------------------------------------------
def test_check_passes_with_a_noisy_fast_path(capsys):
    code, out, _ = run_cli(capsys, "check", "--num-batches", "2", "--max-new-tokens", "8", "--noisy",
                           "--temperature", "0.7", "--seed", "3", *SMALL)
    assert code == 0
    assert "batch 1:" in out and "batch 2:" in out
    assert "PASS: 3 prompt(s) x 2 batch(es)" in out
    stats = dict(kv.split("=") for kv in out.split("stats: ")[1].splitlines()[0].split(", "))
    assert int(stats["rollbacks"]) > 0


def test_check_reports_divergence_and_exits_1(capsys, drifting_canonical_pass):
    code, out, _ = run_cli(capsys, "check", "Once upon a time", "--num-batches", "1", "--max-new-tokens", "6",
                           *SMALL)
    assert code == 1
    assert "batch 1, request 0:" in out and "output position" in out
    assert out.strip().splitlines()[-1].startswith("FAIL:")


def test_check_without_tokenizer_uses_token_id_prompts(capsys, no_tokenizer_checkpoint):
    code, out, _ = run_cli(capsys, "check", "--model", str(no_tokenizer_checkpoint), "--num-batches", "1",
                           "--max-new-tokens", "4", *SMALL)
    assert code == 0 and "PASS: 3 prompt(s)" in out


# -- bench ----------------------------------------------------------------------------------------------
def test_bench_without_the_harness_exits_2(capsys, monkeypatch):
    monkeypatch.setattr(cli, "_find_bench", lambda: None)
    code, out, err = run_cli(capsys, "bench")
    assert code == 2 and out == ""
    assert "benchmark harness" in err and "GPU" in err


def test_bench_forwards_its_arguments_to_the_harness(capsys, monkeypatch):
    seen = []
    monkeypatch.setattr(cli, "_find_bench", lambda: lambda argv: seen.append(argv) or 0)
    code, _, _ = run_cli(capsys, "bench", "--device", "cpu", "--scale", "tiny", "--out", "x.json")
    assert code == 0 and seen == [["--device", "cpu", "--scale", "tiny", "--out", "x.json"]]

    seen.clear()
    code, _, err = run_cli(capsys, "bench", "--scale", "tiny")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    assert code == 0 and seen == [["--device", device, "--scale", "tiny"]]  # where the GPU is
    assert torch.cuda.is_available() or "no CUDA device" in err


def test_bench_help_comes_from_the_checkout_harness(capsys):
    if cli._find_bench() is None:
        pytest.skip("no benchmark harness in this installation")
    code, out, _ = run_cli(capsys, "bench", "--help")
    assert code == 0
    assert "--scale" in out and "--device" in out


# -- entry points ---------------------------------------------------------------------------------------
def test_help_lists_every_subcommand(capsys):
    code, out, _ = run_cli(capsys, "--help")
    assert code == 0
    for command in ("generate", "demo", "check", "bench"):
        assert command in out


def test_console_script_and_module_entry_points(tmp_path):
    script = Path(sys.executable).with_name("llm42")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "llm42"]
    ok = subprocess.run([*command, "--help"], check=False, capture_output=True, text=True, env=ENV, cwd=tmp_path,
                        timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "generate" in ok.stdout
    missing = tmp_path / "missing"
    bad = subprocess.run([sys.executable, "-m", "llm42", "generate", "x", "--model", str(missing)],
                         check=False, capture_output=True, text=True, env=ENV, cwd=tmp_path, timeout=120)
    assert bad.returncode == 2
    assert bad.stdout == ""
    message = f"llm42 generate: error: checkpoint directory '{missing}' does not exist"
    assert bad.stderr.strip().splitlines() == [message]


@pytest.mark.parametrize("order", [None, "budget", "arrival"])
def test_serve_builds_its_generator_with_the_order_of_service_asked_for(capsys, monkeypatch, order):
    """``llm42 serve --order budget`` serves longest-output-first (round 32's H100 A/B: dvr@50 at 0.83-0.88 of
    nondet against 0.65-0.68 in the same process); unless asked, the library's default, ``canonical_budget`` (the
    canonical passes by budget, free requests oldest first); ``--order arrival`` the oldest first everywhere."""
    pytest.importorskip("fastapi")
    from llm42 import server

    served = {}
    monkeypatch.setattr(server, "serve", lambda gen, **kwargs: served.setdefault("gen", gen))
    code, _, _ = run_cli(capsys, "serve", *SMALL, *(("--order", order) if order else ()))
    assert code == 0
    assert type(served["gen"].scheduler) is DefaultScheduler
    assert served["gen"].scheduler.order == (order or "canonical_budget")


def test_serve_refuses_an_unknown_order_naming_the_flag(capsys):
    code, _, err = run_cli(capsys, "serve", "--order", "fifo")
    assert code != 0 and "--order" in err and "'budget'" in err


@pytest.mark.parametrize("flags, bound", [((), None), (("--age-bound", "64"), 64),
                                          (("--order", "budget", "--age-bound", "8"), 8)])
def test_serve_builds_its_generator_with_the_age_bound_asked_for(capsys, monkeypatch, flags, bound):
    """``llm42 serve --age-bound N``: with a budget order, requests admitted N admissions before the newest first."""
    pytest.importorskip("fastapi")
    from llm42 import server

    served = {}
    monkeypatch.setattr(server, "serve", lambda gen, **kwargs: served.setdefault("gen", gen))
    code, _, _ = run_cli(capsys, "serve", *SMALL, *flags)
    assert code == 0
    assert served["gen"].scheduler.age_bound == bound


@pytest.mark.parametrize("flags", [("--order", "arrival", "--age-bound", "8"), ("--age-bound", "0")])
def test_serve_refuses_a_bad_age_bound_naming_the_flag(capsys, flags):
    code, _, err = run_cli(capsys, "serve", *SMALL, *flags)
    assert code != 0 and "--age-bound" in err, err


@pytest.mark.parametrize("flags, admission, wait", [((), "arrival", None), (("--admission", "budget"), "budget", None),
                                                    (("--admission", "budget", "--max-wait-steps", "500"),
                                                     "budget", 500)])
def test_serve_builds_its_generator_with_the_admission_asked_for(capsys, monkeypatch, flags, admission, wait):
    """``llm42 serve --admission budget [--max-wait-steps N]``: the largest budget admitted first where seats or
    K/V are short (round 33's H100 A/B, beside the budget order: SmolLM2's nondet 5.5 % faster than with the order alone),
    a request queued N steps admitted next."""
    pytest.importorskip("fastapi")
    from llm42 import server

    served = {}
    monkeypatch.setattr(server, "serve", lambda gen, **kwargs: served.setdefault("gen", gen))
    code, _, _ = run_cli(capsys, "serve", *SMALL, *flags)
    assert code == 0
    assert (served["gen"].scheduler.admission, served["gen"].scheduler.max_wait_steps) == (admission, wait)
    assert served["gen"]._pool.max_wait_steps == wait


@pytest.mark.parametrize("flags, needle", [(("--admission", "oldest"), "--admission"),
                                           (("--max-wait-steps", "5"), "--admission budget"),
                                           (("--admission", "budget", "--max-wait-steps", "0"), "--max-wait-steps")])
def test_serve_refuses_a_bad_admission_naming_the_flag(capsys, flags, needle):
    code, _, err = run_cli(capsys, "serve", *SMALL, *flags)
    assert code != 0 and needle in err, err


def test_serve_builds_its_generator_with_the_canonical_slices_asked_for(capsys, monkeypatch):
    """``llm42 serve --canonical-slices N``: each canonical pass's layers in N slices, one a step."""
    pytest.importorskip("fastapi")
    from llm42 import server

    served = {}
    monkeypatch.setattr(server, "serve", lambda gen, **kwargs: served.setdefault("gen", gen))
    code, _, _ = run_cli(capsys, "serve", *SMALL, "--canonical-slices", "2")
    assert code == 0
    gen = served.pop("gen")
    assert gen.config.canonical_slices == 2 and gen.verifier.canonical_pass.num_slices == 2
    code, _, _ = run_cli(capsys, "serve", *SMALL)
    assert code == 0 and served["gen"].config.canonical_slices == 1


@pytest.mark.parametrize("flags, needle", [(("--canonical-slices", "0"), "--canonical-slices"),
                                           (("--canonical-slices", "2", "--canonical-thread"), "--canonical-thread"),
                                           (("--canonical-slices", "99"), "canonical_slices")])
def test_serve_refuses_bad_canonical_slices_naming_the_flag(capsys, flags, needle):
    code, _, err = run_cli(capsys, "serve", *SMALL, *flags)
    assert code != 0 and needle in err, err


def test_serve_builds_its_generator_with_the_canonical_sms_asked_for(capsys, monkeypatch):
    """``llm42 serve --canonical-sms N``: the canonical pass on a green context of N SMs (CUDA; on the CPU the knob is
    kept and does nothing); without the flag every SM (None)."""
    pytest.importorskip("fastapi")
    from llm42 import server

    served = {}
    monkeypatch.setattr(server, "serve", lambda gen, **kwargs: served.setdefault("gen", gen))
    code, _, _ = run_cli(capsys, "serve", *SMALL, "--canonical-sms", "32")
    assert code == 0 and served.pop("gen").config.canonical_sms == 32
    code, _, _ = run_cli(capsys, "serve", *SMALL)
    assert code == 0 and served["gen"].config.canonical_sms is None


@pytest.mark.parametrize("value", ["0", "-4"])
def test_serve_refuses_bad_canonical_sms_naming_the_flag(capsys, value):
    code, _, err = run_cli(capsys, "serve", *SMALL, "--canonical-sms", value)
    assert code != 0 and "--canonical-sms" in err, err


def test_serve_builds_its_generator_with_the_canonical_sms_max_rows_asked_for(capsys, monkeypatch):
    """``--canonical-sms-max-rows ROWS``: only passes of at most ROWS rows confined; without it, every one (None)."""
    pytest.importorskip("fastapi")
    from llm42 import server

    served = {}
    monkeypatch.setattr(server, "serve", lambda gen, **kwargs: served.setdefault("gen", gen))
    code, _, _ = run_cli(capsys, "serve", *SMALL, "--canonical-sms", "32", "--canonical-sms-max-rows", "16")
    assert code == 0
    config = served.pop("gen").config
    assert (config.canonical_sms, config.canonical_sms_max_rows) == (32, 16)
    code, _, _ = run_cli(capsys, "serve", *SMALL, "--canonical-sms", "32")
    assert code == 0 and served["gen"].config.canonical_sms_max_rows is None


@pytest.mark.parametrize("flags", [("--canonical-sms-max-rows", "16"),  # without --canonical-sms
                                   ("--canonical-sms", "32", "--canonical-sms-max-rows", "7"),  # under R = 8
                                   ("--canonical-sms", "32", "--canonical-sms-max-rows", "-8")])
def test_serve_refuses_bad_canonical_sms_max_rows_naming_the_flag(capsys, flags):
    code, _, err = run_cli(capsys, "serve", *SMALL, *flags)
    assert code != 0 and "--canonical-sms-max-rows" in err, err
