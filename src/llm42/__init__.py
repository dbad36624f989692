"""llm42: bit-reproducible LLM generation under dynamic batching (decode–verify–rollback).

    from llm42 import DVRGenerator, SamplingParams
    gen = DVRGenerator.from_pretrained()            # the embedded stories260K model
    out = gen.generate(["Once upon a time"], SamplingParams(max_new_tokens=32, deterministic=True))
"""

from llm42.async_engine import AsyncEngine, EngineClosedError, EngineFullError, RequestStream
from llm42.generator import DVRGenerator
from llm42.kv import KVStore, KVStoreProtocol
from llm42.model import CheckpointError, ModelConfig, UnsupportedModelError
from llm42.params import Completion, SamplingParams
from llm42.scheduler import (
    DefaultScheduler,
    InvalidPlanError,
    Plan,
    PrefillChunk,
    RequestView,
    Scheduler,
    SchedulerState,
    fast_prefill_chunks,
    validate_plan,
)
from llm42.verify import CanonicalConfig, Verifier

__version__ = "0.1.0"

__all__ = [
    "DVRGenerator", "AsyncEngine", "RequestStream", "EngineFullError", "EngineClosedError", "SamplingParams", "Completion", "KVStore", "KVStoreProtocol", "ModelConfig",
    "CheckpointError", "UnsupportedModelError", "CanonicalConfig", "Verifier", "Scheduler", "DefaultScheduler",
    "SchedulerState", "RequestView", "Plan", "PrefillChunk", "InvalidPlanError", "validate_plan",
    "fast_prefill_chunks", "__version__",
]
