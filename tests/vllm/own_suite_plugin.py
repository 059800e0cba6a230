"""A pytest plugin that runs vLLM 0.33.0's own unit tests with relaykv.vllm switched on
(tools/vllm_own_tests.sh; docs/vllm.md "vLLM's own tests").

`-p tests.vllm.own_suite_plugin` replaces, before vLLM's test modules import them,
`vllm.v1.core.sched.scheduler.Scheduler` by `relaykv.vllm.Scheduler`, vLLM's
`AsyncScheduler` by its async variant (what `--scheduler-cls relaykv.vllm.Scheduler` builds
under async scheduling) and the `NixlConnector` of vLLM's connector registry by
`RelayKVConnector`. The tests' configs carry no relaykv settings, so the default
`per-group` policy and relaykv's cache manager are on; `RELAYKV_OWN_SUITE_SETTINGS` (a JSON
object, e.g. `{"pd_policy": "legacy"}` or `{"retention": "dense"}`) overrides the plugin's
settings for every engine a test builds. Tests that build vLLM's `KVCacheManager` or
coordinators directly do not go through the scheduler; they run unchanged and say nothing
about the plugin.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

SETTINGS = "RELAYKV_OWN_SUITE_SETTINGS"


def _override_settings(overlay: dict[str, Any]) -> None:
    from relaykv.vllm.options import PluginOptions

    configured = PluginOptions.from_vllm_config

    def from_vllm_config(vllm_config: Any) -> PluginOptions:
        options = configured(vllm_config)
        raw = {
            "pd_policy": options.pd_policy.value,
            "retention": options.retention,
            "eagle_reuse": options.eagle_reuse,
            **overlay,
        }
        return PluginOptions.parse(raw, SETTINGS, options.role)

    PluginOptions.from_vllm_config = staticmethod(from_vllm_config)  # type: ignore[method-assign]


def pytest_configure(config: pytest.Config) -> None:
    import vllm.v1.core.sched.async_scheduler as async_module
    import vllm.v1.core.sched.scheduler as scheduler_module
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    from relaykv.vllm.connector import RelayKVConnector
    from relaykv.vllm.scheduler import AsyncScheduler, Scheduler

    scheduler_module.Scheduler = Scheduler  # type: ignore[misc]
    async_module.AsyncScheduler = AsyncScheduler  # type: ignore[misc]
    KVConnectorFactory._registry["NixlConnector"] = lambda: RelayKVConnector
    if os.environ.get(SETTINGS):
        _override_settings(json.loads(os.environ[SETTINGS]))
