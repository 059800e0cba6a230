"""relaykv.kvcache.tier: the KV tier contract, a second level below the device pool
(docs/design.md §11, docs/tier.md). Never imports torch.

The tier is keyed by the same block hashes as the pool. What each group stores follows from
`GroupRules` (`plan.py`): a full group every block, a sliding or chunked group the blocks
`needed(r)` at each offload boundary r. `index.py` keeps those checkpoints as a tree whose
every node is a complete resume point and evicts leaves only; `lookup.py` finds the longest
hit over pool + tier and where each block lies; `jobs.py` are the copies between the two;
`backend.py` is the protocol a tier (host memory, a shared store) implements; `offload.py`
drives all of it for one engine's cache manager.
"""

from __future__ import annotations

from relaykv.kvcache.tier.backend import InstantTier, SharedTierBackend, TierBackend
from relaykv.kvcache.tier.index import TierIndex
from relaykv.kvcache.tier.jobs import JobKind, TierCopy, TierJob
from relaykv.kvcache.tier.lookup import TieredKeys, find_tiered_hit
from relaykv.kvcache.tier.plan import TierPlan, parse_interval

__all__ = [
    "InstantTier",
    "JobKind",
    "SharedTierBackend",
    "TierBackend",
    "TierCopy",
    "TierIndex",
    "TierJob",
    "TierPlan",
    "TieredKeys",
    "find_tiered_hit",
    "parse_interval",
]
