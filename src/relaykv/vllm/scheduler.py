"""`relaykv.vllm.Scheduler`: vLLM 0.33's scheduler with relaykv's cache (docs/vllm.md).

`--scheduler-cls relaykv.vllm.Scheduler` selects it. Under `pd_policy=legacy` it is vLLM's
scheduler, untouched (the A/B baseline). Under every other policy it replaces the scheduler's
`KVCacheManager` by `RelayKVCacheManager` (every cache decision from `relaykv.kvcache`) and,
after each step, commits what the step computed (relaykv keys blocks once their KV is
written, docs/design.md §6). Everything else (queues, budgets, preemption, the connector's
protocol, outputs, metrics) is vLLM's own code. Under async scheduling it builds
`AsyncScheduler`, the same with vLLM's `AsyncScheduler` bookkeeping (vLLM picks its own
async scheduler only when `--scheduler-cls` is unset).
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

from vllm.distributed.aux_output_connector.connector import AuxOutputSchedulerConnector
from vllm.v1.core.sched.async_scheduler import AsyncScheduler as VllmAsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler as VllmScheduler
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import RequestStatus

from relaykv.vllm.manager import RelayKVCacheManager
from relaykv.vllm.options import PluginOptions
from relaykv.vllm.specs import UnsupportedKVCacheSpec, geometry_from_kv_cache_config

logger = logging.getLogger(__name__)


def unsupported_settings(vllm_config: Any) -> list[str]:
    """vLLM settings the relaykv cache manager does not implement (it refuses them)."""
    problems = []
    if vllm_config.parallel_config.decode_context_parallel_size > 1:
        problems.append("decode context parallelism")
    if vllm_config.scheduler_config.watermark:
        problems.append("--watermark")
    if vllm_config.num_hash_lookahead_tokens:
        problems.append(
            "EAGLE lookahead block hashes (relaykv's successor keys are its own; set "
            "disable_lookahead_block_hashes)"
        )
    transfer = vllm_config.kv_transfer_config
    if (
        vllm_config.aux_output_config.enabled
        and transfer is not None
        and transfer.kv_connector == "RelayKVConnector"
        and transfer.kv_role in ("kv_consumer", "kv_both")
    ):
        # vLLM drops a remote load whose auxiliary outputs are not retained here
        # (`cap_external_hit`); relaykv's decode-side reuse of the P/D plan has no such cap.
        problems.append("auxiliary outputs on a decode engine of RelayKVConnector")
    return problems


class Scheduler(VllmScheduler):
    """vLLM's scheduler; under a relaykv policy its KV cache manager is relaykv's."""

    kv_cache_manager: Any  # vLLM's KVCacheManager, or RelayKVCacheManager (a subclass)
    aux_output_connector: Any
    # relaykv's manager; None: stock vLLM's (legacy, or a model relaykv has no rules for).
    relaykv: RelayKVCacheManager | None = None
    # Why this engine runs stock vLLM's cache manager under a relaykv policy (None: it
    # does not).
    relaykv_fallback: str | None = None

    def __new__(cls, vllm_config: Any, *args: Any, **kwargs: Any) -> Scheduler:
        # `--scheduler-cls` names one class, and vLLM picks its `AsyncScheduler` only when
        # none is named: under async scheduling this class builds its async variant itself.
        if cls is Scheduler and vllm_config.scheduler_config.async_scheduling:
            cls = AsyncScheduler
        return super().__new__(cls)

    def __init__(self, vllm_config: Any, kv_cache_config: Any, *args: Any, **kwargs: Any) -> None:
        self.relaykv_options = PluginOptions.from_vllm_config(vllm_config)
        super().__init__(vllm_config, kv_cache_config, *args, **kwargs)
        # Blocks an in-flight step may still write (async scheduling or PP on a
        # kv_consumer), returned once that step is processed: (fence, finished request or
        # a preempted request's detached blocks).
        self._relaykv_deferred: deque[tuple[int, Any]] = deque()
        if self.relaykv_options.legacy:
            return  # stock vLLM, for A/B
        problems = unsupported_settings(vllm_config)
        if problems:
            raise ValueError(
                f"relaykv.vllm (pd_policy={self.relaykv_options.pd_policy.value}) does not "
                f"support {'; '.join(problems)}; use pd_policy=legacy for stock vLLM"
            )
        try:
            geometry = geometry_from_kv_cache_config(
                kv_cache_config, eagle=self.use_eagle_block_drop
            ).with_eagle_reuse(self.relaykv_options.eagle_reuse)
        except UnsupportedKVCacheSpec as exc:
            # A model relaykv has no rules for (Mamba, cross attention, ...): stock vLLM's
            # cache manager serves it, exactly as without the plugin.
            self.relaykv_fallback = str(exc)
            logger.warning(
                "relaykv.vllm: %s; this engine runs stock vLLM's KV cache manager "
                "(pd_policy=legacy behaviour)",
                exc,
            )
            return
        if geometry.alignment != self.block_size:
            raise ValueError(
                f"relaykv.vllm: vLLM's scheduler block size {self.block_size} is not the lcm "
                f"{geometry.alignment} of the group block sizes"
            )
        self.relaykv = RelayKVCacheManager(
            self.kv_cache_manager,
            geometry,
            self.relaykv_options,
            max_in_flight_tokens=vllm_config.max_in_flight_tokens,
            in_pd_pair=vllm_config.kv_transfer_config is not None,
        )
        self.kv_cache_manager = self.relaykv
        if self.connector is not None:
            self.connector.bind_kv_cache_manager(self.relaykv)
        if self.aux_output_connector is not None:
            # It asks the pool which block hashes stay cached: relaykv's (mirror.py).
            self.aux_output_connector = AuxOutputSchedulerConnector(self.relaykv, self.connector)

    def _free_request(self, request: Any, delay_free_blocks: bool = False) -> Any:
        if self.relaykv is not None:
            # Key what the finished request's steps write before vLLM's finish hooks ask
            # which of its blocks stay cached (the auxiliary-output connector), as vLLM
            # keyed them at allocation.
            self.relaykv.finish(request)
        return super()._free_request(request, delay_free_blocks)

    def _free_request_blocks(self, request: Any) -> None:
        relay = self.relaykv
        if relay is None or self._request_blocks_can_be_freed(request):
            return super()._free_request_blocks(request)
        # A step in flight may still write the blocks: as vLLM does, they return to the
        # pool once that step is processed (`_drain_deferred_frees`).
        if request.is_finished():
            self._relaykv_deferred.append((self.sched_step_seq, request))
        else:
            # A preemption: the request leaves its blocks now (it may be admitted again
            # at once); the blocks stay held until the fence.
            blocks = relay.detach(request)
            if blocks:
                self._relaykv_deferred.append((self.sched_step_seq, blocks))

    def _drain_deferred_frees(self) -> None:
        super()._drain_deferred_frees()
        relay = self.relaykv
        if relay is None:
            return
        deferred = self._relaykv_deferred
        while deferred and deferred[0][0] <= self.processed_step_seq:
            _, held = deferred.popleft()
            if isinstance(held, list):
                relay.free_detached(held)
            else:
                relay.free(held)

    def _request_remaining_blocks(self, request: Any) -> int:
        relay = self.relaykv
        if relay is None:
            return super()._request_remaining_blocks(request)
        # vLLM reserves room for in-flight prefills and async loads by asking its own
        # coordinator; under the plugin relaykv's pool holds the blocks.
        num_tokens = min(request.num_tokens, self.max_model_len)
        if self.num_spec_tokens:
            num_tokens += 1 + self.num_spec_tokens + self.num_lookahead_tokens
        return relay.relay.blocks_to_fit(relay.cache_request(request), num_tokens)

    def _handle_blocked_waiting_request(self, request: Any) -> bool:
        relay = self.relaykv
        if (
            relay is not None
            and request.status == RequestStatus.WAITING_FOR_REMOTE_KVS
            and request.request_id in self.finished_recving_kv_req_ids
        ):
            # The connector reported this request's own transfer; relaykv delivers the
            # load once every shared transfer it waits on has ended too (§7).
            ok = request.request_id not in self.failed_recving_kv_req_ids
            if not relay.own_transfer_ended(request, ok):
                return False
        return super()._handle_blocked_waiting_request(request)

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> Any:
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        relay = self.relaykv
        if relay is not None:
            # The step's KV is written: key it and slide the windows (§6). Finished
            # requests were committed when vLLM freed them.
            for request_id in scheduler_output.num_scheduled_tokens:
                request = self.requests.get(request_id)
                if request is not None and not request.is_finished():
                    relay.commit_step(request)
        return outputs


class AsyncScheduler(Scheduler, VllmAsyncScheduler):
    """`relaykv.vllm.Scheduler` under async scheduling (vLLM's default on a GPU): vLLM's
    `AsyncScheduler` bookkeeping (output placeholders, draft slots) over relaykv's cache.
    `Scheduler` builds it when `async_scheduling` is on; nobody names it."""
