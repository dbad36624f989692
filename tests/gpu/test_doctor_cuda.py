"""``llm42 doctor`` on CUDA: the premises hold for the embedded model (bf16, Triton canonical kernels,
second process included) and for the Llama-3.1-8B-shaped model's real sizes."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("triton")

from llm42 import cli  # noqa: E402
from llm42.doctor import DoctorModel, run_doctor  # noqa: E402

pytestmark = pytest.mark.gpu


def test_doctor_passes_on_cuda(capsys, tmp_path, report):
    path = tmp_path / "doctor.json"
    code = cli.main(["doctor", "--device", "cuda", "--json", str(path)])
    out = capsys.readouterr().out
    print(out)
    assert code == cli.EXIT_OK, out
    result = json.loads(path.read_text())
    assert result["is_ok"] and result["config"]["device"].startswith("cuda")
    assert result["config"]["dtype"] == "bfloat16"
    report("doctor_embedded_cuda_seconds", result["seconds"])


def test_doctor_premises_hold_at_the_llama8b_shape(llama8b, report):
    """Every canonical op at R = 256 with 8B-sized weights; the second process would have to reload
    16 GB of weights through a file, so that premise is left to the embedded-model test above."""
    cfg, weights = llama8b
    result = run_doctor(DoctorModel(weights, cfg, "llama-3.1-8b-shaped"), check_processes=False)
    print(result.format())
    assert result.is_ok, result.format()
    for info in result.info:
        if info.topic == "fast_drift":
            report(f"doctor_8b_fast_drift_{info.op}", f"{info.num_distinct} distinct over {info.num_tried}")
