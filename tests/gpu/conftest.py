"""Fixtures for the GPU tests: the Llama-3.1-8B-shaped random model, and a report of measured facts.

``LLM42_GPU_TEST_LAYERS`` (default 32) sets the model's depth;
``LLM42_GPU_REPORT`` names a file that collects one JSON line per reported fact.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from llm42.model.config import llama31_8b_config
from llm42.model.weights import random_weights

NUM_LAYERS = int(os.environ.get("LLM42_GPU_TEST_LAYERS", "32"))
# output-head scale: logits ~ N(0, (64 * std)^2) per row after the final RMSNorm, so a trained
# model's peaked distributions (median top-1/top-2 gap of a few logits) come from std = 0.2
LM_HEAD_STD = 0.2


@pytest.fixture(scope="session")
def llama8b():
    """(cfg, weights): Llama-3.1-8B-shaped bf16 random weights on the GPU, context 2048."""
    cfg = llama31_8b_config(max_position_embeddings=2048, num_layers=NUM_LAYERS)
    weights = random_weights(cfg, seed=0, dtype=torch.bfloat16, device="cuda", lm_head_std=LM_HEAD_STD)
    return cfg, weights


@pytest.fixture(scope="session")
def report():
    """report(name, value): print a measured fact and append it to $LLM42_GPU_REPORT."""
    path = os.environ.get("LLM42_GPU_REPORT")

    def _report(name: str, value) -> None:
        line = json.dumps({"fact": name, "value": value})
        print(line)
        if path:
            with open(path, "a") as f:
                f.write(line + "\n")

    return _report
