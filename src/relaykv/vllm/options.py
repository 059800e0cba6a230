"""The plugin's settings, read from vLLM's own configs (docs/vllm.md "Flags").

`kv_connector_extra_config` of `--kv-transfer-config` carries them on a P/D engine;
`--additional-config '{"relaykv": {...}}'` on an engine without a connector. Keys:

* `pd_policy`: `legacy` (stock vLLM, untouched), `replay-slack`, `exact`, `per-group`
  (the default; relaykv.kvcache.PDPolicy);
* `retention`: relaykv's retention (`auto`: dense on a prefill engine, `boundaries`
  elsewhere; docs/design.md §6);
* `eagle_reuse`: `drop` (vLLM's EAGLE block drop, the default) or `successor` (relaykv
  keys a draft group's blocks by the next token too; docs/design.md §4). Not `recompute`:
  vLLM's model runner does not compute a hit's last position again into private copies.

A bad value raises a `ValueError` naming the key, before the engine starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from relaykv.kvcache.geometry import EAGLE_REUSE_CACHE_ONLY, EagleReuse
from relaykv.kvcache.pd_config import DEFAULT_PD_POLICY, PDPolicy, Role
from relaykv.kvcache.retention import default_retention, parse_retention

KNOWN_KEYS = ("pd_policy", "retention", "eagle_reuse")


@dataclass(frozen=True, slots=True)
class PluginOptions:
    pd_policy: PDPolicy
    retention: str
    role: Role
    eagle_reuse: EagleReuse = (
        "drop"  # what this engine does: prefill (kv_producer), decode, or both/colocated
    )

    @property
    def legacy(self) -> bool:
        """Stock vLLM: the plugin changes nothing."""
        return self.pd_policy is PDPolicy.LEGACY

    @classmethod
    def from_vllm_config(cls, vllm_config: Any) -> PluginOptions:
        kv_transfer = getattr(vllm_config, "kv_transfer_config", None)
        if kv_transfer is not None:
            raw = kv_transfer.kv_connector_extra_config or {}
            where = "kv_transfer_config.kv_connector_extra_config"
            role = {"kv_producer": Role.PREFILL, "kv_consumer": Role.DECODE}.get(
                kv_transfer.kv_role or "", Role.COLOCATED
            )
        else:
            additional = getattr(vllm_config, "additional_config", None) or {}
            raw = additional.get("relaykv", {}) if isinstance(additional, Mapping) else {}
            where = "additional_config.relaykv"
            role = Role.COLOCATED
        return cls.parse(raw, where, role)

    @classmethod
    def parse(cls, raw: Mapping[str, Any], where: str, role: Role) -> PluginOptions:
        try:
            policy = PDPolicy.parse(str(raw.get("pd_policy", DEFAULT_PD_POLICY.value)))
        except ValueError as exc:
            raise ValueError(f"{where}.pd_policy: {exc}") from None
        retention = str(raw.get("retention", "auto"))
        if retention == "auto":
            retention = default_retention(role)
        try:
            parse_retention(retention, 1)
        except ValueError as exc:
            raise ValueError(f"{where}.retention: {exc}") from None
        eagle_reuse = str(raw.get("eagle_reuse", "drop"))
        if eagle_reuse not in EAGLE_REUSE_CACHE_ONLY:
            raise ValueError(
                f"{where}.eagle_reuse: expected {' or '.join(EAGLE_REUSE_CACHE_ONLY)}, "
                f"got {eagle_reuse!r}"
            )
        return cls(policy, retention, role, eagle_reuse)  # type: ignore[arg-type]
