"""The cache lifecycle: what every driver of a cache may call (docs/design.md §10).

The scheduler, the simulator and `relaykv cache-probe` type against `CacheLifecycle`, not
against the concrete `KVCacheManager` (`manager.py`, the one implementation), so what a
driver may do to a cache is written here, once, and everything else about the manager
(lookup, allocation, hashing, window frees: §5, §6, §8) stays its own business.

One request, in order (a call that returns None or False changed nothing):

    req = cache.add_request(id, prompt, salt, role)   # open: hashes the prompt
    hit = cache.lookup(req)                           # optional: what admit would hit
                                                      #   (receive_local_tokens: receive)
    # computed here (a colocated or prefill engine):
    adm = cache.admit(req, budget, lookahead=k, must_fit=N)  # lookup + blocks; None: wait
                                                      #   (req.copies: page copies its next
                                                      #   step makes first, §4 recompute)
    ended = cache.tier_poll()                         # adm.loads_from_tier: wait for it here
    ok = cache.reserve(req, end, lookahead=k)         # before each later step; False: the
                                                      #   pool is full, preempt someone
    cache.commit(req, processed, new_tokens)          # after each step: hash, slide windows
                                                      #   (and drop the copies' sources)
    cache.preempt(req)                                # back to waiting; admit() again later
                                                      #   (detach=True: blocks a step in
                                                      #   flight writes; free_detached later)
    held = cache.hold_for_transfer(req)               # prefill engine: keep the plan for D
    # received from a prefill engine (a decode engine):
    load = cache.receive(req)                         # None: wait; else fill load.receive
    delivered = cache.load_finished(load, ok)         # the transport ended load's transfer
    cache.release(req)                                # always last (deferred while the
                                                      #   request's own transfer flies)

A load with nothing to receive (everything local or already on its way) may be delivered by
`receive` itself (`load.delivered`); otherwise it is delivered by the `load_finished` of its
own transfer or of the last shared transfer it waits on. A delivered load has cleared
`req.load`; if `load.ok`, the request resumes at N-1 (the full-prompt rule, §7), else the
caller releases it (and may re-open it to recompute).

Besides the lifecycle a driver reads the cache's shape and counters, routes its KV events
and runs its invariant checker after every step (tests, the simulator, the probe).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from relaykv.kvcache.geometry import Geometry
from relaykv.kvcache.lookup import LocalHit
from relaykv.kvcache.pd_config import PDPolicy
from relaykv.kvcache.pool import EventSink
from relaykv.kvcache.request import CacheRequest, CacheRole, KVLoad
from relaykv.kvcache.stats import CacheStats


@dataclass(frozen=True, slots=True)
class Admission:
    """An admitted request: it resumes at `hit.tokens` and computes `num_tokens` now, from
    `start` (`hit.tokens - recomputed`: under `eagle_reuse=recompute` a hit's last position
    is computed again, into private copies named in `CacheRequest.copies`, §4).

    When `hit.tier` names blocks, the hit's `from_tier` tokens come from the KV tier: the
    request waits until `tier_poll` reports its load (docs/tier.md), then runs."""

    hit: LocalHit
    num_tokens: int
    from_tier: int = 0
    recomputed: int = 0

    @property
    def loads_from_tier(self) -> bool:
        return self.hit.num_tier_blocks > 0

    @property
    def start(self) -> int:
        return self.hit.tokens - self.recomputed


class CacheLifecycle(Protocol):
    """One engine's cache as its drivers see it; the module docstring gives the order."""

    @property
    def geometry(self) -> Geometry: ...

    @property
    def pd_policy(self) -> PDPolicy: ...

    @property
    def sibling_reach(self) -> int:
        """The P/D plan's sibling reach in tokens (`pd_plan`): how far below a received
        prompt's end a decode engine keeps the windows its siblings resume at (0: none)."""
        ...

    @property
    def stats(self) -> CacheStats:
        """The counters of docs/design.md §9 (vLLM's metric semantics)."""
        ...

    @property
    def requests(self) -> Mapping[str, CacheRequest]:
        """The open requests by id (opened by `add_request`, forgotten by `release`)."""
        ...

    def add_request(
        self,
        request_id: str,
        prompt: Sequence[int] | np.ndarray,
        salt: str | bytes | None = None,
        role: CacheRole = CacheRole.COLOCATED,
        *,
        recompute: bool = False,
    ) -> CacheRequest:
        """Open a request (hashes its prompt). `recompute`: its prompt was counted in the
        stats already (a failed load computed here after all)."""
        ...

    def admit(
        self,
        req: CacheRequest,
        budget: int,
        *,
        lookahead: int = 0,
        must_fit: int | None = None,
        hit: LocalHit | None = None,
        cap: int | None = None,
        external: int = 0,
        keep_free: int = 0,
    ) -> Admission | None:
        """Look `req` up (§5) and give it blocks for its hit plus up to `budget` tokens
        (+ `lookahead` slots when that reaches its last token); with `must_fit`, only if
        that many tokens fit under the per-request caps (§8). None: the pool cannot hold it
        now. `hit`: `lookup(req, cap)`'s answer, reused while it still holds. `external`:
        tokens after the hit a KV connector writes (blocks, no compute). `keep_free`: blocks
        the admission must leave free (a driver's reservation)."""
        ...

    def lookup(self, req: CacheRequest, cap: int | None = None) -> LocalHit:
        """The local hit `admit` would take for `req` now (§5), resuming at most at `cap`;
        changes no block. For a driver whose scheduler asks before it allocates (vLLM's,
        `relaykv.vllm`), which hands it to `admit`."""
        ...

    def blocks_to_fit(self, req: CacheRequest, num_tokens: int, hit: LocalHit | None = None) -> int:
        """Free blocks `req` still needs to hold `num_tokens` tokens (per-group caps, §8);
        changes nothing."""
        ...

    def receive_local_tokens(self, req: CacheRequest) -> int:
        """The local tokens `receive` would reuse for `req` now (§7,
        `KVLoad.local_tokens`); changes no block."""
        ...

    def reserve(self, req: CacheRequest, num_tokens: int, lookahead: int = 0) -> bool:
        """Blocks for positions `[0, num_tokens + lookahead)` of an admitted request; False:
        the pool is short (the caller preempts and retries)."""
        ...

    def commit(self, req: CacheRequest, processed: int, new_tokens: Iterable[int] = ()) -> None:
        """After a step: append the sampled tokens, hash the blocks whose KV is written for
        positions `[0, processed)`, free what no later position reads (§6)."""
        ...

    def preempt(self, req: CacheRequest, *, detach: bool = False) -> list[int]:
        """Release a running request's blocks for recompute; it stays open with its hashes.
        `detach`: a step in flight may still write them: they stay held and are returned
        for `free_detached` once that step is processed."""
        ...

    def free_detached(self, blocks: Sequence[int]) -> None:
        """Return blocks `preempt(detach=True)` handed out."""
        ...

    def hold_for_transfer(self, req: CacheRequest) -> list[list[tuple[int, int]]]:
        """Prefill side: keep exactly the blocks of the P/D plan (§7), free the rest; per
        group the `(block index, block id)` pairs the decode engine may read."""
        ...

    def receive(self, req: CacheRequest) -> KVLoad | None:
        """Decode side: plan the load of `req`'s prompt from a prefill engine (§7). None: the
        pool cannot hold it now."""
        ...

    def load_finished(self, load: KVLoad, ok: bool) -> list[KVLoad]:
        """The transport ended `load`'s own transfer; returns the loads delivered now."""
        ...

    def tier_poll(self) -> list[tuple[CacheRequest, bool]]:
        """Apply the KV tier's finished jobs; the requests whose tier load ended, with
        success (loaded: resume at the admission's hit; failed: admit again). Empty without
        a tier (docs/tier.md)."""
        ...

    def tier_delivered(self) -> list[KVLoad]:
        """P/D loads whose KV tier part ended in the last `tier_poll` and that are delivered
        now (a decode engine's load asks P only for what its tier lacks)."""
        ...

    def release(self, req: CacheRequest) -> None:
        """Release all of a request's blocks, tail first (§3), and forget it; deferred while
        its own transfer is in flight (`load_finished` completes it)."""
        ...

    def set_event_sink(self, sink: EventSink | None) -> None:
        """Send the cache's KV events to `sink` (docs/kv-events.md)."""
        ...

    def usage(self) -> float:
        """The fraction of the pool's usable blocks held by requests (vLLM's
        `kv_cache_usage_perc`)."""
        ...

    def check(self) -> list[str]:
        """Violations of the cache's invariants (§3, §7); empty when consistent."""
        ...


__all__ = ["Admission", "CacheLifecycle"]
