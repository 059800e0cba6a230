"""Signed grants: the transfer parameters P returns, bound to the prompt P computed.

P signs (HMAC-SHA256 under the grant key derived from the cluster secret,
transport/wire/auth.py) the parameters that tell D what to read: the request id, P's engine
id and endpoint, the block ids per group, the exact block hashes of the prompt P computed
for those blocks, the prompt length, the policy, the destination engine if the request named
one, and an expiry. D refuses parameters that are unsigned, altered, expired, meant for
another engine, or whose hashes differ from the hashes D computes over the prompt it was
given: KV computed for one prompt can never be published under another prompt's hashes
(docs/security.md; KV cache poisoning, issue #10 item 2). The refusal is a 400 before
anything is allocated or read.

The hash of block k of group g is the group's block key (docs/kvcache.md: chained over the
prompt and the cache salt) when block k is full, else a digest of the whole prompt, so the
partial last block is bound too.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Sequence
from typing import Any

import xxhash

from relaykv.common.plumbing.derived_keys import derive_key
from relaykv.kvcache import CacheRequest, KVCacheManager
from relaykv.kvcache.hashing import salt_prefix, token_bytes

SIGNATURE_KEY = "grant_signature"
SIGNED_KEYS = (
    "remote_request_id", "remote_engine_id", "source", "remote_num_tokens", "pd_policy",
    "sibling_reach", "lease_seconds", "remote_block_ids", "block_hashes", "expires_at",
    "destination_engine_id",
)


def prompt_block_hashes(
    manager: KVCacheManager,
    prompt: Sequence[int],
    salt: str | None,
    held: Sequence[Sequence[Sequence[int]]],
) -> list[list[str]]:
    """Per group, the hex hash of each held block index (`held[g]` = [(index, block), ...])."""
    probe = CacheRequest("grant", list(prompt), manager.rules, manager.geometry.hash_unit, salt)
    whole = xxhash.xxh3_128_hexdigest(salt_prefix(salt) + token_bytes(list(prompt)))
    out = []
    for group, pairs in enumerate(held):
        keys = probe.keys(group)
        out.append([keys[k].hex() if k < len(keys) else whole for k, _ in pairs])
    return out


class GrantSigner:
    """Signs and checks transfer parameters with the cluster's grant key."""

    def __init__(self, secret: bytes) -> None:
        self._key = derive_key(secret, "grants")

    def _mac(self, params: dict[str, Any]) -> str:
        signed = {k: params.get(k) for k in SIGNED_KEYS}
        data = json.dumps(signed, sort_keys=True, separators=(",", ":")).encode()
        return hmac.new(self._key, data, hashlib.sha256).hexdigest()

    def sign(self, params: dict[str, Any], lifetime_s: float) -> dict[str, Any]:
        params = {**params, "expires_at": round(time.time() + lifetime_s, 3)}
        params[SIGNATURE_KEY] = self._mac(params)
        return params

    def check(
        self,
        params: dict[str, Any],
        *,
        engine_id: str,
        manager: KVCacheManager,
        prompt: Sequence[int],
        salt: str | None,
    ) -> None:
        """ValueError (the engine's 400) unless P of this cluster issued `params` for
        exactly this prompt, for this engine or any, and they have not expired."""
        signature = params.get(SIGNATURE_KEY)
        try:
            expected_mac = self._mac(params)
        except (TypeError, ValueError, RecursionError):
            expected_mac = ""
        if not isinstance(signature, str) or not hmac.compare_digest(signature, expected_mac):
            raise ValueError(
                "kv_transfer_params are not signed by a prefill engine of this cluster "
                "(forged, altered, or another cluster's secret)"
            )
        expires = params.get("expires_at")
        if not isinstance(expires, int | float) or time.time() > expires:
            raise ValueError("kv_transfer_params have expired (the prefill engine's lease ended)")
        destination = params.get("destination_engine_id")
        if destination is not None and destination != engine_id:
            raise ValueError(f"kv_transfer_params were issued for engine {destination!r}")
        if params.get("remote_num_tokens") != len(prompt):
            raise ValueError(
                f"kv_transfer_params are for a {params.get('remote_num_tokens')}-token prompt, "
                f"this prompt has {len(prompt)} tokens"
            )
        source = params.get("source")
        if not isinstance(source, dict) or source.get("engine_id") != params["remote_engine_id"]:
            raise ValueError("kv_transfer_params name a source that is not the signing engine")
        expected = prompt_block_hashes(manager, prompt, salt, params["remote_block_ids"])
        if params.get("block_hashes") != expected:
            got = params.get("block_hashes") or []
            group = next(
                (g for g, hashes in enumerate(expected) if g >= len(got) or got[g] != hashes), 0
            )
            raise ValueError(
                "kv_transfer_params were issued for a different prompt: block hashes of group "
                f"{group} differ from this prompt's (nothing was read or cached)"
            )
