"""The engine's parts below the public facade: its config, request bookkeeping and device-resident decode state."""

from llm42.engine.config import EngineConfig
from llm42.engine.requests import Request, RequestPool

__all__ = ["EngineConfig", "Request", "RequestPool"]
