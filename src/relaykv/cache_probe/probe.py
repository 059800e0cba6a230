"""`cache-probe`: what will my hit be? The cache alone, no model (docs/design.md §5-§7).

A prefill engine P prefills a prompt of N tokens and a decode engine D receives it under a P/D
policy; then three follow-ups arrive, each prefilled on P and decoded on D: `resend` (the same
prompt), `extension` (the prompt plus new tokens) and `sibling` (a shared prefix, then different
tokens, same length). A colocated engine serves the same sequence for comparison. Every request
goes through the real `KVCacheManager` exactly as the engine drives it; only the model compute is
absent (no KV bytes exist, so "transfers" complete instantly). With `--tier-blocks N` a
colocated engine with a KV tier of N blocks serves the follow-ups after its device pool let
every block go: what a lookup would hit from a tier of that size (docs/tier.md).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from relaykv.kvcache.base import CacheLifecycle
from relaykv.kvcache.geometry import Geometry
from relaykv.kvcache.groups import rules_for
from relaykv.kvcache.invariants import assert_consistent
from relaykv.kvcache.manager import KVCacheManager
from relaykv.kvcache.pd_config import PDPolicy
from relaykv.kvcache.request import CacheRequest, CacheRole
from relaykv.kvcache.tier import InstantTier

FOLLOW_UPS = ("resend", "extension", "sibling")


@dataclass(frozen=True, slots=True)
class ProbePrompts:
    first: list[int]
    resend: list[int]
    extension: list[int]
    sibling: list[int]

    @classmethod
    def make(
        cls, n: int, extension_len: int, sibling_diverge: int, seed: int = 0, vocab: int = 32000
    ) -> ProbePrompts:
        rng = random.Random(seed)
        first = [rng.randrange(vocab) for _ in range(n)]
        extension = first + [rng.randrange(vocab) for _ in range(extension_len)]
        keep = n - sibling_diverge
        tail = [rng.randrange(vocab) for _ in range(sibling_diverge)]
        if tail and tail[0] == first[keep]:
            tail[0] = (tail[0] + 1) % vocab  # the sibling must diverge right at `keep`
        return cls(first, list(first), extension, first[:keep] + tail)


class _Engine:
    """Walks requests through one manager's lifecycle the way the engine's scheduler does,
    minus the model (docs/design.md §10)."""

    def __init__(self, manager: CacheLifecycle, name: str) -> None:
        self.manager = manager
        self.name = name
        self._ids = 0

    def open(self, prompt: list[int], role: CacheRole) -> CacheRequest:
        self._ids += 1
        return self.manager.add_request(f"{self.name}-{self._ids}", prompt, role=role)

    def compute(self, req: CacheRequest, end: int) -> None:
        """Compute positions up to `end`: reserve, then commit after the step."""
        m = self.manager
        if not m.reserve(req, end):
            raise RuntimeError(f"{self.name}: pool too small for the probe")
        m.commit(req, end)
        assert_consistent(m)

    def prefill(self, prompt: list[int], role: CacheRole) -> tuple[CacheRequest, int]:
        m = self.manager
        req = self.open(prompt, role)
        admission = m.admit(req, len(prompt))
        if admission is None:
            raise RuntimeError(f"{self.name}: pool too small for the probe")
        self.compute(req, len(prompt))
        return req, admission.start

    def decode_one(self, req: CacheRequest) -> None:
        """Sample one token (max_tokens=1): no further KV is computed; finish."""
        self.manager.commit(req, req.num_tokens, [0])
        self.manager.release(req)
        assert_consistent(self.manager)


def _engine_pair(
    geometry: Geometry, policy: PDPolicy, retention: str, blocks: int
) -> tuple[_Engine, _Engine]:
    def manager() -> KVCacheManager:
        return KVCacheManager(geometry, blocks, retention=retention, pd_policy=policy, pd_role=True)

    return _Engine(manager(), "P"), _Engine(manager(), "D")


def pool_blocks(geometry: Geometry, prompts: ProbePrompts) -> int:
    """Blocks per engine pool, for both probe engines (relaykv's and vLLM's)."""
    longest = len(prompts.extension) + geometry.alignment
    per_request = sum(rule.blocks_for(longest) for rule in rules_for(geometry))
    return 8 * per_request + 16  # never evicts: the probe measures reuse, not capacity


def probe_colocated(geometry: Geometry, retention: str, prompts: ProbePrompts) -> dict[str, int]:
    engine = _Engine(
        KVCacheManager(geometry, pool_blocks(geometry, prompts), retention=retention), "C"
    )
    req, _ = engine.prefill(prompts.first, CacheRole.COLOCATED)
    engine.decode_one(req)
    hits = {}
    for name in FOLLOW_UPS:
        req, hits[name] = engine.prefill(getattr(prompts, name), CacheRole.COLOCATED)
        engine.decode_one(req)
    return hits


def probe_decode(
    geometry: Geometry, policy: PDPolicy, retention: str, prompts: ProbePrompts
) -> dict[str, dict[str, int | list[int]]]:
    p, d = _engine_pair(geometry, policy, retention, pool_blocks(geometry, prompts))
    out: dict[str, dict[str, int | list[int]]] = {}
    for name in ("first_load", *FOLLOW_UPS):
        prompt = prompts.first if name == "first_load" else getattr(prompts, name)
        p_req, _ = p.prefill(prompt, CacheRole.PREFILL)
        p_held = p.manager.hold_for_transfer(p_req)
        d_req = d.open(prompt, CacheRole.DECODE)
        load = d.manager.receive(d_req)
        if load is None:
            raise RuntimeError("D: pool too small for the probe")
        load.transfer_pairs(p_held)  # both sides derive the same lists from one plan
        out[name] = {"local_tokens": load.local_tokens, "received_blocks": load.received_blocks()}
        if not load.delivered:
            assert load in d.manager.load_finished(load, ok=True)
        p.manager.release(p_req)  # D has read the blocks: P releases its lease
        # D recomputes the last prompt token (full-prompt rule), then samples one token.
        d.compute(d_req, len(prompt))
        d.decode_one(d_req)
        assert_consistent(p.manager)
    return out


def probe_tier(
    geometry: Geometry, retention: str, prompts: ProbePrompts, tier_blocks: int
) -> dict[str, dict[str, int]]:
    """A colocated engine with a KV tier of `tier_blocks` blocks (docs/tier.md): after each
    request its device pool is flushed (every cached block let go), so the follow-ups hit
    only what the tier kept. Per follow-up: the hit and the tokens the tier added."""
    manager = KVCacheManager(
        geometry,
        pool_blocks(geometry, prompts),
        retention=retention,
        tier=InstantTier(tier_blocks),
    )
    engine = _Engine(manager, "T")

    def settle() -> None:
        assert manager.tier_poll() == []  # only stores are in flight between requests
        assert manager.pool.reset()  # the pool lets every cached block go

    req, _ = engine.prefill(prompts.first, CacheRole.COLOCATED)
    engine.decode_one(req)
    settle()
    out: dict[str, dict[str, int]] = {}
    for name in FOLLOW_UPS:
        req = engine.open(getattr(prompts, name), CacheRole.COLOCATED)
        admission = manager.admit(req, req.num_tokens)
        if admission is None:
            raise RuntimeError("T: pool too small for the probe")
        if admission.loads_from_tier:
            assert [ok for _, ok in manager.tier_poll()] == [True]
        out[name] = {"hit": admission.start, "from_tier": admission.from_tier}
        engine.compute(req, req.num_tokens)
        engine.decode_one(req)
        settle()
    return out


def run_probe(
    geometry: Geometry,
    policy: PDPolicy | str,
    prompt_len: int,
    *,
    retention: str = "boundaries",
    extension_len: int = 48,
    sibling_diverge: int = 24,
    seed: int = 0,
    tier_blocks: int | None = None,
) -> dict[str, object]:
    """`tier_blocks`: also probe a colocated engine with a KV tier of that many blocks."""
    prompts = ProbePrompts.make(prompt_len, extension_len, sibling_diverge, seed)
    out = probe_result(
        geometry,
        policy,
        prompt_len,
        probe_colocated(geometry, retention, prompts),
        probe_decode(geometry, PDPolicy.parse(policy), retention, prompts),
    )
    if tier_blocks is not None:
        out["tier"] = {
            "tier_blocks": tier_blocks,
            **probe_tier(geometry, retention, prompts, tier_blocks),
        }
    return out


def probe_result(
    geometry: Geometry,
    policy: PDPolicy | str,
    prompt_len: int,
    colocated: dict[str, int],
    decode: dict[str, dict[str, int | list[int]]],
) -> dict[str, object]:
    """The probe's JSON record, whichever engine ran it (relaykv's, or vLLM's through the
    plugin: `relaykv.vllm.probe`)."""
    return {
        "prompt_len": prompt_len,
        "alignment": geometry.alignment,
        "pd_policy": policy,
        "colocated": colocated,
        "decode": decode,
    }
