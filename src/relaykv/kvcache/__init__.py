"""relaykv.kvcache: the hybrid KV cache contract (docs/design.md). Never imports torch."""

from __future__ import annotations

from relaykv.kvcache.base import Admission, CacheLifecycle
from relaykv.kvcache.decode_loads import DecodeLoads
from relaykv.kvcache.geometry import (
    PRESETS,
    Geometry,
    GroupKey,
    GroupSpec,
    LayerGroup,
    cdiv,
    group_layers,
    parse_groups,
    preset,
)
from relaykv.kvcache.groups import (
    KINDS,
    ChunkedLocalGroup,
    FullAttentionGroup,
    GroupRules,
    SlidingWindowGroup,
    rules_for,
)
from relaykv.kvcache.hashing import TokenHashes, chain_hashes
from relaykv.kvcache.invariants import assert_consistent, check_manager
from relaykv.kvcache.lookup import LocalHit, find_longest_hit
from relaykv.kvcache.manager import KVCacheManager
from relaykv.kvcache.pd_config import DEFAULT_PD_POLICY, PD_POLICIES, ROLES, PDPolicy, Role
from relaykv.kvcache.pd_plan import PDPlan, pd_plan, pd_slack_tokens
from relaykv.kvcache.pool import NULL_BLOCK, BlockPool, KVEvent
from relaykv.kvcache.request import CacheRequest, CacheRole, KVLoad, LoadState
from relaykv.kvcache.retention import Retention, parse_retention, replay_boundaries
from relaykv.kvcache.sizing import CacheSizing
from relaykv.kvcache.stats import CacheStats

__all__ = [
    "DEFAULT_PD_POLICY",
    "KINDS",
    "NULL_BLOCK",
    "PD_POLICIES",
    "PRESETS",
    "ROLES",
    "Admission",
    "BlockPool",
    "CacheLifecycle",
    "CacheRequest",
    "CacheRole",
    "CacheSizing",
    "CacheStats",
    "ChunkedLocalGroup",
    "DecodeLoads",
    "FullAttentionGroup",
    "Geometry",
    "GroupKey",
    "GroupRules",
    "GroupSpec",
    "KVCacheManager",
    "KVEvent",
    "KVLoad",
    "LayerGroup",
    "LoadState",
    "LocalHit",
    "PDPlan",
    "PDPolicy",
    "Retention",
    "Role",
    "SlidingWindowGroup",
    "TokenHashes",
    "assert_consistent",
    "cdiv",
    "chain_hashes",
    "check_manager",
    "find_longest_hit",
    "group_layers",
    "parse_groups",
    "parse_retention",
    "pd_plan",
    "pd_slack_tokens",
    "preset",
    "replay_boundaries",
    "rules_for",
]
