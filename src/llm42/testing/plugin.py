"""The llm42 pytest plugin (loaded automatically once llm42 is installed).

It gives a determinism suite three things:

- a ``gpu`` marker; ``gpu`` tests are skipped when CUDA is not available;
- the options ``--llm42-checkpoint PATH`` (a Hugging Face checkpoint
  directory; default: the embedded stories260K model) and ``--llm42-device``
  (default ``cpu``);
- the session fixture ``llm42_generator_factory``: a callable that builds a
  *fresh* ``DVRGenerator`` over that checkpoint on every call, forwarding its
  keyword arguments (``window=``, ``group=``, ``fast_policy=``, ``scheduler=``,
  ``dtype=``, ...) to ``DVRGenerator.from_pretrained``.

The fixture is session-scoped so hypothesis ``@given`` tests can use it; each
call still returns a generator with its own K/V store and request state. The
tokenizer is loaded once per session (loading it is the slow part), the
weights once per generator.
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("llm42", "llm42 determinism testing")
    group.addoption(
        "--llm42-checkpoint",
        default=None,
        metavar="PATH",
        help="Hugging Face checkpoint directory for llm42_generator_factory (default: the embedded stories260K model)",
    )
    group.addoption(
        "--llm42-device",
        default="cpu",
        metavar="DEVICE",
        help="torch device for llm42_generator_factory (default: cpu)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped without one)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def llm42_checkpoint(pytestconfig: pytest.Config):
    """The checkpoint directory given with ``--llm42-checkpoint`` (a ``Path``), or None for the embedded model."""
    from pathlib import Path

    value = pytestconfig.getoption("--llm42-checkpoint")
    return None if value is None else Path(value)


@pytest.fixture(scope="session")
def llm42_device(pytestconfig: pytest.Config) -> str:
    """The device given with ``--llm42-device`` (default ``cpu``); skips the requesting test if CUDA is missing."""
    import torch

    device = pytestconfig.getoption("--llm42-device")
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        pytest.skip(f"--llm42-device={device} but CUDA is not available")
    return device


@pytest.fixture(scope="session")
def llm42_generator_factory(llm42_checkpoint, llm42_device):
    """``factory(**kwargs) -> DVRGenerator``: a fresh generator over the session's checkpoint.

    Keyword arguments go to ``DVRGenerator.from_pretrained``; ``device``
    defaults to ``--llm42-device``. A bad checkpoint fails here with the
    loader's error (``CheckpointError`` / ``UnsupportedModelError``).
    """
    from llm42 import DVRGenerator
    from llm42.model import embedded_model_path, load_tokenizer

    path = embedded_model_path() if llm42_checkpoint is None else llm42_checkpoint
    tokenizers = {}

    def factory(**kwargs) -> DVRGenerator:
        kwargs.setdefault("device", llm42_device)
        if "tokenizer" not in kwargs:
            if path not in tokenizers:
                tokenizers[path] = load_tokenizer(path)
            kwargs["tokenizer"] = tokenizers[path]
        return DVRGenerator.from_pretrained(path, **kwargs)

    return factory
