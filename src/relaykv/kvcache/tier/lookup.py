"""The lookup over device pool + tier (docs/tier.md "Lookup").

A block is available when its key is in the pool's map or the tier's (stored) map; the exact
lookup of §5 runs unchanged over that union, so the hit is the longest resume point at which
every group holds every block of `needed(r)` in one place or the other. Each block of the hit
is then placed: on the device when the pool has it (no copy), else in the tier (loaded into
a fresh block before the request computes). The brute-force oracle
(`relaykv.cache_probe.oracle.oracle_hit`) over the same union checks it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from relaykv.kvcache.groups import GroupRules
from relaykv.kvcache.lookup import CachedKeys, LocalHit, hit_junction, resume_point
from relaykv.kvcache.pool import NULL_BLOCK
from relaykv.kvcache.request import CacheRequest


class _Either(Mapping[bytes, int]):
    """One group's keys on the device or in the tier (values: device blocks first)."""

    __slots__ = ("device", "tier")

    def __init__(self, device: Mapping[bytes, int], tier: Mapping[bytes, int]) -> None:
        self.device, self.tier = device, tier

    def __contains__(self, key: object) -> bool:
        return key in self.device or key in self.tier

    def __getitem__(self, key: bytes) -> int:
        if key in self.device:
            return self.device[key]
        return self.tier[key]

    def __iter__(self) -> Iterator[bytes]:
        yield from self.device
        yield from (k for k in self.tier if k not in self.device)

    def __len__(self) -> int:
        return sum(1 for _ in self)


class Present(Mapping[bytes, int]):
    """1 for each key on the device or in the tier: a probe map for the per-group reuse rule
    (`decode_loads.reusable_blocks` reads 0 as absent, and tier slot 0 is a real slot)."""

    __slots__ = ("device", "tier")

    def __init__(self, device: Mapping[bytes, int], tier: Mapping[bytes, int]) -> None:
        self.device, self.tier = device, tier

    def __getitem__(self, key: bytes) -> int:
        if key in self.device or key in self.tier:
            return 1
        raise KeyError(key)

    def __iter__(self) -> Iterator[bytes]:
        return iter(_Either(self.device, self.tier))

    def __len__(self) -> int:
        return len(_Either(self.device, self.tier))


class TieredKeys:
    """`CachedKeys` over a pool's maps and a tier's: what a lookup with a tier sees."""

    __slots__ = ("maps",)

    def __init__(self, device: CachedKeys, tier: CachedKeys) -> None:
        self.maps: Sequence[Mapping[bytes, int]] = [
            _Either(d, t) for d, t in zip(device.maps, tier.maps, strict=True)
        ]


def find_tiered_hit(
    req: CacheRequest,
    rules: tuple[GroupRules, ...],
    pool: CachedKeys,
    tier: CachedKeys,
    cap: int | None = None,
) -> LocalHit:
    """The exact hit of `req` over `pool` and `tier`: device blocks in `blocks`, blocks to
    load in `tier` (as `(block index, slot)`, with nulls in `blocks`)."""
    candidate, proven_shared, cap = resume_point(req, rules, TieredKeys(pool, tier), cap)
    device_maps, tier_maps = pool.maps, tier.maps
    blocks: list[list[int]] = []
    loads: list[list[tuple[int, int]]] = []
    for rule in rules:
        g = rule.index
        keys = req.keys(g)
        count = candidate // rule.block_size
        start = rule.needed(candidate).start if candidate > 0 else 0
        table = [NULL_BLOCK] * count
        here: list[tuple[int, int]] = []
        dmap, tmap = device_maps[g], tier_maps[g]
        for k in range(start, count):
            block = dmap.get(keys[k])
            if block is not None:
                table[k] = block
            else:
                here.append((k, tmap[keys[k]]))
        blocks.append(table)
        loads.append(here)
    return LocalHit(candidate, blocks, hit_junction(rules, candidate, proven_shared, cap), loads)
