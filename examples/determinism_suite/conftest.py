"""Hypothesis settings for the determinism suite.

Each example generates text with several fresh generators, far slower than a
unit test, so there is no per-example deadline and a modest example count.
Raise ``max_examples`` (or pass ``--hypothesis-profile``) for a longer soak.
The fixture ``llm42_generator_factory`` and the options ``--llm42-checkpoint``
/ ``--llm42-device`` come from llm42's pytest plugin, loaded automatically.
"""

from hypothesis import HealthCheck, settings

settings.register_profile(
    "llm42-determinism",
    deadline=None,
    max_examples=8,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("llm42-determinism")
