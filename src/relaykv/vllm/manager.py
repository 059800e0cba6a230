"""relaykv's cache manager behind vLLM's `KVCacheManager` surface (docs/vllm.md "The seam").

vLLM's scheduler asks its `KVCacheManager` for a request's local hit
(`get_computed_blocks`), for blocks (`allocate_slots`), to key received blocks
(`cache_blocks`) and to free (`free`). `RelayKVCacheManager` answers every one of these
from `relaykv.kvcache.KVCacheManager` (the contract of docs/design.md §10), the way NVIDIA
Dynamo's KVBM puts its own block manager behind the same surface: lookup, allocation,
hashing, window frees, the P/D plan and the received blocks' keys are relaykv's, one rule
for relaykv's engine and for vLLM. vLLM's `KVCacheBlock` objects stand for relaykv's block
ids (both pools number blocks from the null block 0), so block tables, connector metadata
and the worker see ordinary vLLM blocks.

The mapping, call by call:

| vLLM call                          | relaykv                                           |
|------------------------------------|---------------------------------------------------|
| `get_computed_blocks`              | `lookup` (P/D decode request: `receive_local_tokens`) |
| `allocate_slots` (first)           | `admit`, or `receive` for an async P/D load       |
| `allocate_slots` (later)           | `reserve`                                         |
| `cache_blocks` after a load        | `load_finished(ok=True)`                          |
| `cache_blocks`, `remove_skipped_blocks`, a step's end | `commit` (processed tokens)    |
| `free`                             | `release` (finished) or `preempt` (running)       |
| P side `request_finished` (connector) | `hold_for_transfer`                            |

vLLM's own coordinator stays constructed but never decides anything; its read-only
helpers (group metadata for KV events) are reused, and its per-group block lists, its
block pool and vLLM's block objects read relaykv's state (relaykv/vllm/mirror.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vllm.distributed.kv_events import KVCacheEvent
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_manager import KVCacheManager as VllmKVCacheManager
from vllm.v1.request import Request

from relaykv.kvcache.geometry import Geometry
from relaykv.kvcache.lookup import LocalHit
from relaykv.kvcache.manager import KVCacheManager
from relaykv.kvcache.pd_config import PDPolicy, Role
from relaykv.kvcache.pd_plan import pd_plan
from relaykv.kvcache.pool import KVEvent
from relaykv.kvcache.request import CacheRequest, KVLoad
from relaykv.vllm.events import to_vllm_event
from relaykv.vllm.mirror import adopt_blocks
from relaykv.vllm.options import PluginOptions
from relaykv.vllm.request_salt import request_salt

# The transfer parameter naming the relaykv policy the prefill engine ran (both sides).
POLICY_PARAM = "relaykv_pd_policy"


def request_role(request: Request) -> Role:
    """What a vLLM request is to the cache: the decode side of a P/D transfer from a prefill
    engine that ran relaykv's plan, the prefill side (its KV goes to a decode engine), or
    neither. A load from a prefill engine without the plugin (no `relaykv_pd_policy` in
    its parameters) is an ordinary connector load into the blocks relaykv allocates, as in
    stock vLLM."""
    params = request.kv_transfer_params or {}
    if params.get("do_remote_prefill"):
        return Role.DECODE if POLICY_PARAM in params else Role.COLOCATED
    if params.get("do_remote_decode"):
        return Role.PREFILL
    return Role.COLOCATED


class RelayKVCacheManager(VllmKVCacheManager):
    """vLLM's `KVCacheManager` surface over relaykv's `KVCacheManager` (`self.relay`)."""

    def __init__(
        self,
        stock: VllmKVCacheManager,
        geometry: Geometry,
        options: PluginOptions,
        *,
        max_in_flight_tokens: int,
        in_pd_pair: bool,
    ) -> None:
        # vLLM's attributes (configs, stats, the empty block list, event metadata): the
        # scheduler and the connectors read them directly.
        self.__dict__.update(stock.__dict__)
        try:
            self.relay = KVCacheManager(
                geometry,
                self.kv_cache_config.num_blocks,
                retention=options.retention,
                pd_policy=options.pd_policy,
                enable_caching=self.enable_caching,
                max_model_len=self.max_model_len,
                max_in_flight_tokens=max_in_flight_tokens,
                pd_role=in_pd_pair,
            )
        except ValueError as exc:
            raise ValueError(f"relaykv.vllm: {exc}") from None
        self.geometry = geometry
        self.options = options
        # vLLM's pool, per-group block lists and block objects become live views of
        # relaykv's (relaykv/vllm/mirror.py): what vLLM's components read stays true.
        view = adopt_blocks(stock.block_pool, self.coordinator, self.relay)
        self.block_pool = view
        self.names = view.names
        self._block_objects = view.blocks  # vLLM's KVCacheBlock by block id
        self._requests: dict[str, Request] = {}
        # Loads vLLM still tracks (its request waits for remote KV), even once relaykv
        # delivered them at `receive` because nothing had to move.
        self._loads: dict[str, KVLoad] = {}
        # Requests whose connector loads their external tokens asynchronously: keyed only
        # once vLLM reports the load (`cache_blocks`).
        self._external_loads: set[str] = set()
        # The last local hit `get_computed_blocks` found: (request id, hit), handed to
        # `admit` when vLLM allocates for that request right after (one lookup per admission).
        self._last_hit: tuple[str, LocalHit] | None = None
        self._events: list[KVCacheEvent] = []
        if self.enable_kv_cache_events:
            self.relay.set_event_sink(self._on_event)

    @property
    def pd_policy(self) -> PDPolicy:
        return self.relay.pd_policy

    # -- relaykv requests ---------------------------------------------------------------
    def cache_request(self, request: Request) -> CacheRequest:
        """relaykv's record of `request`, opened (prompt hashed, role fixed) on first use."""
        creq = self.relay.requests.get(request.request_id)
        if creq is None:
            creq = self.relay.add_request(
                request.request_id,
                list(request.all_token_ids),
                salt=request_salt(request),
                role=request_role(request),
            )
            self._requests[request.request_id] = request
            self.names.name(request, creq)
        return creq

    def _commit(self, request: Request, creq: CacheRequest, processed: int) -> None:
        """Append the request's new tokens and key what `processed` tokens wrote (§6)."""
        if creq.load is not None or request.request_id in self._external_loads:
            return  # its KV is still arriving: keys come with the load's end
        new_tokens = list(request.all_token_ids[creq.num_tokens : request.num_tokens])
        self.relay.commit(creq, max(0, processed), new_tokens)
        self.names.name(request, creq)

    def commit_step(self, request: Request) -> None:
        """After a step: key what the request's processed tokens wrote, free dead windows."""
        creq = self.relay.requests.get(request.request_id)
        if creq is not None:
            self._commit(request, creq, request.num_computed_tokens - request.num_in_flight_tokens)

    def load_of(self, request: Request) -> KVLoad | None:
        """The P/D load of `request` until vLLM resumes it (None: it has none)."""
        return self._loads.get(request.request_id)

    def own_transfer_ended(self, request: Request, ok: bool) -> bool:
        """The connector reported `request`'s own transfer ended. True once the load is
        delivered (it may still wait on a shared transfer another request brings, §7)."""
        load = self._loads.get(request.request_id)
        if load is None:
            return True
        if load.pending:
            for settled in self.relay.load_finished(load, ok):
                # The received blocks are keyed now: name them (mirror.py).
                waiting = self._requests.get(settled.request.request_id)
                if waiting is not None:
                    self.names.name(waiting, settled.request)
        return load.delivered

    # -- vLLM's surface -------------------------------------------------------------------
    @property
    def usage(self) -> float:
        return self.relay.usage()

    def get_computed_blocks(
        self, request: Request, max_cache_hit_length: int | None = None
    ) -> tuple[KVCacheBlocks, int, int]:
        if not self.prefix_cache_lookup_enabled(request):
            return self.empty_kv_cache_blocks, 0, 0
        creq = self.cache_request(request)
        if creq.role is Role.DECODE:
            # A P/D load: what D reuses is the plan's business (`receive`); vLLM's scheduler
            # only counts it, on its scheduler block grid.
            local = self.relay.receive_local_tokens(creq)
            return self.empty_kv_cache_blocks, local - local % self.geometry.alignment, 0
        # vLLM's cap (`max_cache_hit_length`: an aux-output connector's retained prefix)
        # bounds the resume point like the N-1 rule does; the hit stays block-aligned.
        hit = self.relay.lookup(creq, max_cache_hit_length)
        self._last_hit = (request.request_id, hit)
        return self._blocks(hit.blocks), hit.tokens, 0

    def get_computed_blocks_for_connector(
        self, request: Request, max_cache_hit_length: int | None = None
    ) -> tuple[KVCacheBlocks, int, int, bool]:
        return *self.get_computed_blocks(request, max_cache_hit_length), False

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
        skip_zeroing_group_ids: tuple[int, ...] = (),
    ) -> KVCacheBlocks | None:
        creq = self.cache_request(request)
        if not any(creq.tables):
            return self._first_allocation(
                request,
                creq,
                num_new_tokens,
                num_new_computed_tokens,
                num_lookahead_tokens,
                num_external_computed_tokens,
                delay_cache_blocks,
                full_sequence_must_fit,
                reserved_blocks,
            )
        end = min(request.num_computed_tokens + num_new_tokens, self.max_model_len)
        lookahead = max(0, min(num_lookahead_tokens, self.max_model_len - end))
        before = [len(table) for table in creq.tables]
        if not self.relay.reserve(creq, end, lookahead):
            return None
        return self._blocks(
            [table[start:] for table, start in zip(creq.tables, before, strict=True)]
        )

    def _first_allocation(
        self,
        request: Request,
        creq: CacheRequest,
        num_new_tokens: int,
        num_new_computed_tokens: int,
        num_lookahead_tokens: int,
        num_external_computed_tokens: int,
        delay_cache_blocks: bool,
        full_sequence_must_fit: bool,
        reserved_blocks: int,
    ) -> KVCacheBlocks | None:
        memo, self._last_hit = self._last_hit, None
        if num_external_computed_tokens > 0 and creq.role is Role.DECODE:
            if not delay_cache_blocks:
                raise RuntimeError(
                    f"relaykv.vllm: request {request.request_id}: a load from a prefill "
                    "engine running relaykv.vllm must be asynchronous (RelayKVConnector)"
                )
            plan = pd_plan(self.geometry, self.relay.pd_policy, creq.num_prompt_tokens)
            if reserved_blocks and plan.held_blocks() + reserved_blocks > self.relay.pool.num_free:
                return None  # keep vLLM's reservation for in-flight prefills
            load = self.relay.receive(creq)
            if load is None:
                return None
            self._loads[request.request_id] = load
            return self.get_blocks(request.request_id)
        must_fit = min(request.num_tokens, self.max_model_len) if full_sequence_must_fit else None
        hit = memo[1] if memo is not None and memo[0] == request.request_id else None
        if hit is not None and hit.tokens != num_new_computed_tokens:
            hit = None  # vLLM's scheduler dropped the hit
        # A connector's external tokens (a sync load, or an async one vLLM waits for) are
        # written into the blocks relaykv allocates after the hit, as in stock vLLM.
        admission = self.relay.admit(
            creq,
            num_new_tokens,
            lookahead=num_lookahead_tokens,
            must_fit=must_fit,
            hit=hit,
            cap=num_new_computed_tokens,
            external=num_external_computed_tokens,
            keep_free=reserved_blocks,
        )
        if admission is None:
            return None
        if num_external_computed_tokens and delay_cache_blocks:
            self._external_loads.add(request.request_id)
        if admission.start != num_new_computed_tokens:
            raise RuntimeError(
                f"relaykv.vllm: request {request.request_id}: the hit changed between lookup "
                f"({num_new_computed_tokens}) and allocation ({admission.start})"
            )
        return self.get_blocks(request.request_id)

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        creq = self.relay.requests.get(request.request_id)
        if creq is None:
            return
        if request.request_id in self._external_loads:
            # vLLM's scheduler reports an async connector load ended: what it loaded is
            # written now.
            self._external_loads.discard(request.request_id)
            self._commit(request, creq, num_computed_tokens)
            return
        load = self._loads.pop(request.request_id, None)
        if load is not None:
            # vLLM calls this once the connector reported the load received (§7: the
            # received blocks get keys only now, `load_finished`).
            self.own_transfer_ended(request, ok=True)
            return
        self._commit(request, creq, num_computed_tokens)

    def remove_skipped_blocks(
        self,
        request_id: str,
        processed_computed_tokens: int,
        num_prompt_tokens: int | None = None,
    ) -> None:
        request = self._requests.get(request_id)
        creq = self.relay.requests.get(request_id)
        if request is not None and creq is not None:
            self._commit(request, creq, processed_computed_tokens)

    def free(self, request: Request) -> None:
        creq = self.relay.requests.get(request.request_id)
        if creq is None:
            return
        if creq.load is not None and not request.is_finished():
            raise RuntimeError(
                f"relaykv.vllm: request {request.request_id} cannot be freed while its KV "
                "load is in flight"
            )
        if request.is_finished():
            self.finish(request)
        else:
            self._commit(request, creq, request.num_computed_tokens - request.num_in_flight_tokens)
        self._external_loads.discard(request.request_id)
        if request.is_finished():
            self.relay.release(creq)  # deferred while its own transfer is pending
            load = self._loads.get(request.request_id)
            if load is not None and load.pending:
                # Finished (aborted) while it waited for its KV: vLLM frees such a request
                # only once its transfer is over, or never began, so nothing writes the
                # blocks any more. Its load settles as failed (nothing it received is keyed)
                # and its blocks return; left pending, they would stay held for good.
                self.own_transfer_ended(request, ok=False)
            self._requests.pop(request.request_id, None)
            self._loads.pop(request.request_id, None)
            self.names.forget(request.request_id)
        else:
            self.relay.preempt(creq)  # preempted: keeps its tokens and hashes

    def finish(self, request: Request) -> None:
        """`request` finished: key what its handed-out steps write. They write the KV of
        every known token they cover before any later step reads it (vLLM keys them at
        allocation); drafts and placeholders lie past `num_tokens`. The scheduler calls
        this before vLLM's finish hooks (the auxiliary-output connector asks the pool which
        of the request's blocks stay cached), `free` again (idempotent)."""
        creq = self.relay.requests.get(request.request_id)
        if creq is not None:
            self._commit(request, creq, min(request.num_computed_tokens, request.num_tokens))

    def detach(self, request: Request) -> list[int]:
        """A preempted request whose blocks a step in flight may still write: it leaves
        them (it keeps its tokens and hashes); the caller hands the returned blocks to
        `free_detached` once that step is processed (vLLM's deferred frees)."""
        creq = self.relay.requests.get(request.request_id)
        if creq is None:
            return []
        self._commit(request, creq, request.num_computed_tokens - request.num_in_flight_tokens)
        self._external_loads.discard(request.request_id)
        return self.relay.preempt(creq, detach=True)

    def free_detached(self, blocks: list[int]) -> None:
        self.relay.free_detached(blocks)

    def hold_for_transfer(self, request: Request) -> tuple[list[int], ...]:
        """Prefill side: keep exactly the P/D plan's blocks (§7) for the decode engine;
        per group their ids, in block-index order (`plan.held[g]`)."""
        creq = self.cache_request(request)
        self._commit(request, creq, request.num_computed_tokens - request.num_in_flight_tokens)
        held = self.relay.hold_for_transfer(creq)
        self.names.name(request, creq)
        return tuple([block for _, block in group] for group in held)

    def receive_blocks(self, request: Request) -> KVCacheBlocks:
        """Decode side: the blocks the transport fills from the prefill engine, per group."""
        load = self.load_of(request)
        if load is None:
            return self.empty_kv_cache_blocks
        return self._blocks([[block for _, block in group] for group in load.receive])

    def received_indices(self, request: Request) -> list[list[int]]:
        """Decode side: the block index of each block in `receive_blocks`, per group."""
        load = self.load_of(request)
        if load is None:
            return [[] for _ in self.relay.rules]
        return [[k for k, _ in group] for group in load.receive]

    def pop_blocks_for_free(self, request: Request) -> list[Any]:
        raise RuntimeError(
            "relaykv.vllm: the scheduler defers relaykv's frees itself "
            "(relaykv.vllm.Scheduler._free_request_blocks)"
        )

    def evict_blocks(self, block_ids: set[int]) -> None:
        self.block_pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        if not self.relay.pool.reset():
            return False
        if self.log_stats and self.prefix_cache_stats is not None:
            self.prefix_cache_stats.reset = True
        return True

    def take_events(self) -> list[KVCacheEvent]:
        events, self._events = self._events, []
        return events

    def _on_event(self, event: KVEvent) -> None:
        self._events.append(to_vllm_event(event, self.geometry))

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        creq = self.relay.requests.get(request_id)
        if creq is None:
            return self.empty_kv_cache_blocks
        return self._blocks(creq.tables)

    def estimate_cached_tokens(self, request: Request) -> int:
        """Leading prompt tokens whose blocks carry a key in every full group."""
        creq = self.relay.requests.get(request.request_id)
        if creq is None:
            return 0
        keyed = self.relay.pool.block_key
        cached = None
        for rule in self.relay.rules:
            if not rule.prefix_closed:
                continue
            run = 0
            for block in creq.tables[rule.index]:
                if not block or keyed[block] is None:
                    break
                run += 1
            tokens = run * rule.block_size
            cached = tokens if cached is None else min(cached, tokens)
        return cached or 0

    def truncate_computed_blocks(
        self, blocks: KVCacheBlocks, num_computed_tokens: int
    ) -> KVCacheBlocks:
        return blocks  # relaykv's hits are whole; the scheduler only truncates sub-block tails

    def take_new_block_ids(self) -> list[int]:
        return []  # attention-only groups: nothing to zero

    def record_blocks_for_zeroing(self, request_id: str, start_token: int) -> None:
        return None

    def take_kv_cache_block_copies(self) -> tuple[list[Any], list[Any]]:
        return [], []

    def take_boundary_state_offloads(self) -> dict[str, list[tuple[int, int, int]]]:
        return {}

    def finalize_partial_tail_offloads(self, request: Request) -> list[tuple[int, int, int]]:
        return []

    def new_step_starts(self) -> None:
        return None

    def _blocks(self, tables: Sequence[Sequence[int]]) -> KVCacheBlocks:
        objects = self._block_objects
        return self.create_kv_cache_blocks(tuple([objects[b] for b in t] for t in tables))
