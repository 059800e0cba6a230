"""`RelayKVConnector`: vLLM's NIXL connector with relaykv's P/D plan (docs/vllm.md).

Select it with `--kv-transfer-config '{"kv_connector": "RelayKVConnector",
"kv_connector_module_path": "relaykv.vllm.connector", "kv_role": ...,
"kv_connector_extra_config": {"pd_policy": "per-group"}}'`.

The worker half is NIXL's (`NixlPullConnectorWorker`), unchanged: the same handshake, READs,
leases, heartbeats and failure reports. Only the scheduler half's block lists change, and
only when the scheduler runs relaykv's cache manager (`relaykv.vllm.Scheduler` under a
relaykv policy); otherwise the connector is exactly `NixlConnector`.

* Prefill side (`request_finished`): the blocks offered to the decode engine are the P/D
  plan's (`hold_for_transfer`, docs/design.md §7), not NIXL's window clip
  (`cdiv(W, b) + 1` trailing blocks of each sliding group, with no EAGLE term).
* Decode side (`update_state_after_alloc`): the blocks to fill are the plan's blocks D does
  not reuse locally (`KVLoad.receive`), and the remote list is narrowed to P's blocks at the
  same block indices, so NIXL's end-aligned pairing (`_apply_prefix_caching`) pairs them
  index by index.
* Both sides put `relaykv_pd_policy` in the transfer parameters; a decode engine refuses a
  prefill engine that ran another policy (the plan would differ). A prefill engine without
  the plugin sends none: its loads are NIXL's own, into the blocks relaykv allocated (stock
  vLLM's behaviour, logged once).
"""

from __future__ import annotations

import logging
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import NixlPullConnector
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_scheduler import (
    NixlPullConnectorScheduler,
)
from vllm.v1.request import Request, RequestStatus

from relaykv.kvcache.pd_config import Role
from relaykv.kvcache.pd_plan import pd_plan
from relaykv.vllm.manager import POLICY_PARAM, RelayKVCacheManager, request_role

logger = logging.getLogger(__name__)


class RelayKVConnectorScheduler(NixlPullConnectorScheduler):
    """NIXL's scheduler half; block lists from relaykv's plan when `relay` is bound."""

    relay: RelayKVCacheManager | None = None
    _warned_stock_prefill = False

    def get_exchange_clipped_blocks(self, block_ids: Any, clip_ssm: bool = True) -> Any:
        if self.relay is None:
            return super().get_exchange_clipped_blocks(block_ids, clip_ssm)
        # relaykv's plan already chose exactly the blocks to exchange.
        return self.kv_cache_config.select_transfer_block_ids(block_ids) if block_ids else block_ids

    def update_state_after_alloc(
        self, request: Request, blocks: Any, num_external_tokens: int
    ) -> None:
        relay = self.relay
        params = request.kv_transfer_params
        if relay is None or not params or not params.get("do_remote_prefill"):
            return super().update_state_after_alloc(request, blocks, num_external_tokens)
        if request_role(request) is not Role.DECODE:
            # The prefill engine ran stock vLLM (no relaykv plan): NIXL's own pairing fills
            # the blocks relaykv allocated, as in stock vLLM (no decode-side reuse).
            if not self._warned_stock_prefill:
                self._warned_stock_prefill = True
                logger.warning(
                    "relaykv.vllm: request %s comes from a prefill engine without relaykv.vllm "
                    "(no %s): loaded as stock vLLM does, without relaykv's decode-side reuse",
                    request.request_id,
                    POLICY_PARAM,
                )
            return super().update_state_after_alloc(request, blocks, num_external_tokens)
        remote = params.get("remote_block_ids")
        if remote and num_external_tokens > 0:
            theirs = params.get(POLICY_PARAM)
            if theirs != relay.pd_policy.value:
                raise ValueError(
                    f"relaykv.vllm: request {request.request_id} comes from a prefill engine "
                    f"with pd_policy={theirs!r} but this decode engine runs "
                    f"{relay.pd_policy.value!r}: both must run relaykv.vllm with one policy"
                )
            plan = pd_plan(relay.geometry, relay.pd_policy, request.num_prompt_tokens)
            indices = relay.received_indices(request)
            narrowed = []
            for g, wanted in enumerate(indices):
                start = plan.held[g].start
                if len(remote[g]) != len(plan.held[g]):
                    raise ValueError(
                        f"relaykv.vllm: request {request.request_id}: the prefill engine "
                        f"offered {len(remote[g])} blocks of group {g}, the plan holds "
                        f"{len(plan.held[g])}"
                    )
                narrowed.append([remote[g][k - start] for k in wanted])
            params["remote_block_ids"] = narrowed
            blocks = relay.receive_blocks(request)
        super().update_state_after_alloc(request, blocks, num_external_tokens)

    def request_finished(
        self, request: Request, block_ids: Any
    ) -> tuple[bool, dict[str, Any] | None]:
        relay = self.relay
        if relay is None:
            return super().request_finished(request, block_ids)
        params = request.kv_transfer_params
        if (
            params
            and params.get("do_remote_decode")
            and request.status
            in (RequestStatus.FINISHED_LENGTH_CAPPED, RequestStatus.FINISHED_STOPPED)
        ):
            block_ids = relay.hold_for_transfer(request)
        delay, out = super().request_finished(request, block_ids)
        if out is not None:
            out[POLICY_PARAM] = relay.pd_policy.value
        return delay, out


class RelayKVConnector(NixlPullConnector):
    """`NixlConnector` (pull mode) whose scheduler half follows relaykv's P/D plan."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        if role == KVConnectorRole.SCHEDULER:
            self.connector_scheduler = RelayKVConnectorScheduler(
                vllm_config, self.engine_id, kv_cache_config
            )

    def bind_kv_cache_manager(self, kv_cache_manager: Any) -> None:
        super().bind_kv_cache_manager(kv_cache_manager)
        if isinstance(self.connector_scheduler, RelayKVConnectorScheduler):
            relay = kv_cache_manager if isinstance(kv_cache_manager, RelayKVCacheManager) else None
            self.connector_scheduler.relay = relay
