"""relaykv inside vLLM 0.33.0: the decode-side cache fix as an out-of-tree plugin (docs/vllm.md).

The one folder of relaykv that imports vLLM, and nothing of relaykv imports it
(tools/check_layers.py): `relaykv cache-probe --engine vllm` runs `python -m
relaykv.vllm.probe` in the vLLM venv (tools/vllm_venv.sh). A user adds two flags to
`vllm serve`: `--scheduler-cls relaykv.vllm.Scheduler` and a `--kv-transfer-config` naming
`RelayKVConnector` from `relaykv.vllm.connector`.

* `compat`: the vLLM version this plugin was tested with; importing it on another refuses.
* `specs`: vLLM's KV cache groups (`KVCacheSpec`s, the EAGLE draft's groups) as relaykv's
  `Geometry`, and back (for the probe).
* `options`: the plugin's settings (`pd_policy`, `retention`) from vLLM's configs.
* `manager`: `RelayKVCacheManager`, relaykv's `KVCacheManager` behind vLLM's
  `KVCacheManager` surface: every cache decision comes from `relaykv.kvcache`.
* `mirror`: vLLM's block pool, per-group block lists and block objects as live views of
  relaykv's pool and tables (what vLLM's components and connectors read stays true).
* `scheduler`: `Scheduler`, vLLM's scheduler with that manager (policies other than
  `legacy`; `legacy` is stock vLLM untouched).
* `connector`: `RelayKVConnector`, vLLM's NIXL connector whose block lists come from
  relaykv's P/D plan (the worker half is NIXL's, unchanged).
* `events`: relaykv's KV events in vLLM's format (`BlockStored` with `group_idx`, kind, window).
* `probe`: `cache-probe` driven through vLLM's real scheduler with a stand-in worker.
"""

from __future__ import annotations

from relaykv.vllm.compat import check_vllm_version

check_vllm_version()

from relaykv.vllm.scheduler import Scheduler  # noqa: E402  (after the version gate)

__all__ = ["Scheduler"]
