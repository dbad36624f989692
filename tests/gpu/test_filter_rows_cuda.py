"""Listed top-k / top-p rows on CUDA: tests/test_filter_rows.py's engine test with the decode and mixed steps
replayed from CUDA graphs at the 8B shape (the ``FILTER_LISTED`` variant's graphs read the staged ``filter_rows``)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from llm42 import sampler  # noqa: E402,F401  (monkeypatched by the CPU test's _serve)
from tests import test_filter_rows as cpu  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("mixed_steps", [False, True])
def test_listed_filter_rows_on_cuda_graphs(llama8b, monkeypatch, mixed_steps):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    cpu.test_listed_filter_rows_serve_what_filtering_every_row_serves(monkeypatch, mixed_steps, model=llama8b)
