"""KV tier backends: where the blocks of `relaykv.kvcache.tier` live (docs/tier.md).

`base.py` states what a backend factory receives, `host.py` is the native host-memory tier
(`--kv-offloading-backend native`), `registry.py` maps `--kv-offloading-backend` names to
factories. Every backend implements `relaykv.kvcache.tier.TierBackend`.
"""

from __future__ import annotations
