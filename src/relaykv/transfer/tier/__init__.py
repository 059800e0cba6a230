"""KV tier backends: where the blocks of `relaykv.kvcache.tier` live (docs/tier.md).

`base.py` states what a backend factory receives, `host.py` is the native host-memory tier
(`--kv-offloading-backend native`), `mooncake.py` the tier shared by a cluster's engines
(`--kv-offloading-backend mooncake`, a Mooncake Store; `store_keys.py` names and tags its
objects, `store_master.py` runs its master), `registry.py` maps `--kv-offloading-backend`
names to factories. Every backend implements `relaykv.kvcache.tier.TierBackend`.
"""

from __future__ import annotations
