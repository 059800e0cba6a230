"""Cache statistics with the metric semantics of docs/design.md §9 (vLLM's names).

* local: `prefix_cache_queries` (prompt tokens of new requests) and `prefix_cache_hits`
  (tokens reused from this engine's cache);
* external: `external_prefix_cache_queries` (prompt tokens not hit locally, on requests that
  asked another engine) and `external_prefix_cache_hits` (tokens received from it);
* `prompt_tokens_by_source`: local_compute + local_cache_hit + external_kv_transfer = prompt;
* per group, tokens and bytes reused locally vs received (the `per-group` policy's figure);
* KV bytes received and sent, loads started, coalesced and failed, lease expiries.

A decode engine recomputes the last prompt token after a full-prompt load, so a load of an
N-token prompt with a local hit of r tokens counts r local, N-1-r external, 1 computed.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields


@dataclass(slots=True)
class CacheStats:
    num_groups: int = 1
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0
    external_prefix_cache_queries: int = 0
    external_prefix_cache_hits: int = 0
    tokens_local_compute: int = 0
    tokens_local_cache_hit: int = 0
    tokens_external_kv_transfer: int = 0
    kv_bytes_received: int = 0
    kv_bytes_from_tier: int = 0  # decode side: prompt KV its KV tier filled instead of P
    kv_bytes_sent: int = 0
    loads_started: int = 0
    loads_coalesced: int = 0
    loads_failed: int = 0
    lease_expiries: int = 0
    group_local_tokens: list[int] = field(default_factory=list)
    group_received_tokens: list[int] = field(default_factory=list)
    group_local_bytes: list[int] = field(default_factory=list)
    group_received_bytes: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in (
            "group_local_tokens",
            "group_received_tokens",
            "group_local_bytes",
            "group_received_bytes",
        ):
            if not getattr(self, name):
                setattr(self, name, [0] * self.num_groups)

    def record_local(
        self, prompt_tokens: int, hit_tokens: int, preempted: bool = False, from_tier: int = 0
    ) -> None:
        """A request computed here after a local lookup of `hit_tokens`, of which `from_tier`
        the KV tier added (loaded: counted as external, as vLLM counts its offloading
        connector's hits; docs/tier.md "Metrics")."""
        if preempted:
            self.preempted_queries += prompt_tokens
            self.preempted_hits += hit_tokens
            return
        local = hit_tokens - from_tier
        self.prefix_cache_queries += prompt_tokens
        self.prefix_cache_hits += local
        if from_tier:
            self.external_prefix_cache_queries += prompt_tokens - local
            self.external_prefix_cache_hits += from_tier
            self.tokens_external_kv_transfer += from_tier
        self.tokens_local_cache_hit += local
        self.tokens_local_compute += prompt_tokens - hit_tokens

    def record_load(self, prompt_tokens: int, local_tokens: int) -> None:
        """A decode-side load: `local_tokens` reused here, the rest but one received."""
        external = max(0, prompt_tokens - 1 - local_tokens)
        self.prefix_cache_queries += prompt_tokens
        self.prefix_cache_hits += local_tokens
        self.external_prefix_cache_queries += prompt_tokens - local_tokens
        self.external_prefix_cache_hits += external
        self.tokens_local_cache_hit += local_tokens
        self.tokens_external_kv_transfer += external
        self.tokens_local_compute += prompt_tokens - local_tokens - external
        self.loads_started += 1

    def record_group_reuse(
        self, group: int, local_tokens: int, received_tokens: int, page_bytes: int, block_size: int
    ) -> None:
        self.group_local_tokens[group] += local_tokens
        self.group_received_tokens[group] += received_tokens
        self.group_local_bytes[group] += local_tokens // block_size * page_bytes
        self.group_received_bytes[group] += received_tokens // block_size * page_bytes

    def snapshot(self) -> dict[str, int | list[int]]:
        return {f.name: _copy(getattr(self, f.name)) for f in fields(self)}


def _copy(value: int | list[int]) -> int | list[int]:
    return list(value) if isinstance(value, list) else value
