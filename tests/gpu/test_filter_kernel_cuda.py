"""Top-k / top-p requests on CUDA at the 8B shape, from graphs: tests/test_filter_steps.py's checks where the
threshold is the kernel (``kernels.sampling.filter_threshold``) in decode, mixed and canonical steps."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from tests import test_filter_steps as cpu  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("mixed_steps", [False, True])
def test_the_filter_kernel_keeps_deterministic_filtered_requests_bits_on_cuda(llama8b, mixed_steps):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    cpu.check_filtered_steps(mixed_steps, model=llama8b)
