"""relaykv.engine: requests, scheduling, the step loop (and its log) and its async front (no model
imports)."""

from __future__ import annotations

from relaykv.common.messages.steps import InvalidRequest, SamplingParams
from relaykv.engine.async_engine import AsyncEngine, EngineDeadError
from relaykv.engine.connector import KVConnector
from relaykv.engine.engine import EngineConfig, LLMEngine
from relaykv.engine.executor import Executor
from relaykv.engine.metrics import EngineMetrics, Histogram
from relaykv.engine.request import FinishReason, Request, RequestOutput, RequestState
from relaykv.engine.scheduler import KV_LOAD_FAILURE_POLICIES, Scheduler, SchedulerConfig

__all__ = [
    "KV_LOAD_FAILURE_POLICIES",
    "AsyncEngine",
    "EngineConfig",
    "EngineDeadError",
    "EngineMetrics",
    "Executor",
    "FinishReason",
    "Histogram",
    "InvalidRequest",
    "KVConnector",
    "LLMEngine",
    "Request",
    "RequestOutput",
    "RequestState",
    "SamplingParams",
    "Scheduler",
    "SchedulerConfig",
]
