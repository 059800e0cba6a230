"""Sizing and admission: one per-request block cap for startup and run time (docs/design.md §8).

The most blocks a running request can hold in a group is `GroupRules.worst_case_blocks`
(sliding: `cdiv(min(W - 1 + slack + in_flight_tokens, max_model_len), b) + 1`; full:
`cdiv(max_model_len, b)`). Pool sizing, the maximum-concurrency report and the runtime
admission check all read `CacheSizing.caps`, so what startup admitted is admissible later.
`slack` comes from the P/D plan (`pd_slack_tokens`) for engines in a P/D role.
"""

from __future__ import annotations

from dataclasses import dataclass

from relaykv.kvcache.geometry import Geometry, cdiv
from relaykv.kvcache.groups import rules_for
from relaykv.kvcache.pd_config import PDPolicy
from relaykv.kvcache.pd_plan import pd_slack_tokens
from relaykv.kvcache.retention import landing_point


def group_caps(
    geometry: Geometry, max_model_len: int, max_in_flight_tokens: int, slack: tuple[int, ...]
) -> tuple[int, ...]:
    """Per group, the most blocks one running request can hold (§8)."""
    return tuple(
        rule.worst_case_blocks(max_model_len, max_in_flight_tokens, slack[rule.index])
        for rule in rules_for(geometry)
    )


def min_reusable_prefix(geometry: Geometry, limit: int = 1 << 20) -> int:
    """Shortest prompt whose identical resend can hit (alignment plus the EAGLE unit)."""
    rules = rules_for(geometry)
    n = geometry.alignment + 1
    while n <= limit:
        if landing_point(geometry, rules, n, n - 1) > 0:
            return n
        n += 1
    return limit


@dataclass(frozen=True, slots=True)
class CacheSizing:
    """Startup numbers of a cache: pool size, per-request caps, maximum concurrency."""

    geometry: Geometry
    num_blocks: int
    max_model_len: int
    max_in_flight_tokens: int
    slack: tuple[int, ...]
    caps: tuple[int, ...]

    @classmethod
    def build(
        cls,
        geometry: Geometry,
        num_blocks: int,
        max_model_len: int,
        max_in_flight_tokens: int,
        pd_policy: PDPolicy | None = None,
        sibling_reach: int = 0,
    ) -> CacheSizing:
        """`pd_policy` is set on P/D engines: their plan's retention (with its sibling reach)
        counts in the caps."""
        slack = (
            pd_slack_tokens(geometry, pd_policy, sibling_reach)
            if pd_policy
            else (0,) * geometry.num_groups
        )
        caps = group_caps(geometry, max_model_len, max_in_flight_tokens, slack)
        return cls(geometry, num_blocks, max_model_len, max_in_flight_tokens, slack, caps)

    @staticmethod
    def blocks_for_memory(geometry: Geometry, memory_bytes: int) -> int:
        """Pool blocks that fit in `memory_bytes` (the null block included in the count)."""
        if geometry.block_bytes <= 0:
            raise ValueError("the geometry has no KV bytes per token; cannot size by memory")
        return memory_bytes // geometry.block_bytes

    @property
    def blocks_per_request(self) -> int:
        return sum(self.caps)

    @property
    def max_concurrency(self) -> float:
        """How many requests of `max_model_len` tokens the pool holds at once."""
        return (self.num_blocks - 1) / self.blocks_per_request

    def admission_blocks(self, num_tokens: int) -> int:
        """Blocks a request of `num_tokens` (prompt + max output) may need at its peak."""
        tokens = min(num_tokens, self.max_model_len)
        return sum(
            min(cap, cdiv(tokens, g.block_size))
            for cap, g in zip(self.caps, self.geometry.groups, strict=True)
        )

    def fits_at_startup(self) -> bool:
        """At least one request of `max_model_len` tokens fits in the pool."""
        return self.blocks_per_request <= self.num_blocks - 1

    @property
    def min_reusable_prefix(self) -> int:
        return min_reusable_prefix(self.geometry)

    def describe(self) -> str:
        caps = ", ".join(f"g{i}:{c}" for i, c in enumerate(self.caps))
        return (
            f"pool {self.num_blocks} blocks; per-request caps [{caps}] = {self.blocks_per_request}"
            f" blocks; max concurrency {self.max_concurrency:.2f} at {self.max_model_len} tokens;"
            f" shortest reusable prompt {self.min_reusable_prefix} tokens"
        )
