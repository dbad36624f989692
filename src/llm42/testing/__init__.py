"""Test helpers for determinism suites: hypothesis strategies and assertion helpers.

- :mod:`llm42.testing.strategies` (``prompts``, ``sampling_params``,
  ``arrival_schedules``, ``batch_mixes``, ``fast_policies``,
  ``canonical_configs``, ``wide_model_config``, ``wide_model_configs``) needs
  hypothesis (the ``dev`` extra). Its names are importable from here too.
- :mod:`llm42.testing.assertions` (``assert_matches_reference``,
  ``check_against_reference``, ``run_schedule``, ``first_divergence``) needs
  llm42 only.
- :mod:`llm42.testing.harness` (``run_random_batches``, ``random_batch``,
  ``filler_prompts``, ...): the random-batch harness ``llm42 check`` and
  ``llm42 demo`` run; llm42 only.

The strategies load on first use, so importing this package (or its pytest
plugin) works without hypothesis installed.
"""

from __future__ import annotations

import importlib

from llm42.testing.assertions import (
    Divergence,
    ReferenceCheck,
    ScheduleRun,
    assert_matches_reference,
    check_against_reference,
    first_divergence,
    run_schedule,
)

_STRATEGIES = (
    "prompts", "sampling_params", "arrival_schedules", "batch_mixes", "fast_policies",
    "canonical_configs", "wide_model_config", "wide_model_configs",
)

__all__ = [
    "Divergence", "ReferenceCheck", "ScheduleRun", "assert_matches_reference", "check_against_reference",
    "first_divergence", "run_schedule", "strategies", *_STRATEGIES,
]


def __getattr__(name: str):
    if name == "strategies" or name in _STRATEGIES:
        strategies = importlib.import_module("llm42.testing.strategies")
        return strategies if name == "strategies" else getattr(strategies, name)
    raise AttributeError(f"module 'llm42.testing' has no attribute {name!r}")
