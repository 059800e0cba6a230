"""Paged attention: per-step plans over block tables and the backends that run them."""

from __future__ import annotations

from relaykv.model.attention.backend import AttentionBackend, TorchPagedAttention
from relaykv.model.attention.plan import GroupPlan, QueryRun, build_group_plan

__all__ = ["AttentionBackend", "GroupPlan", "QueryRun", "TorchPagedAttention", "build_group_plan"]
