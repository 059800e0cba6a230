"""The P/D connector: the engine's `KVConnector`, over a KV transport (docs/design.md §7).

On a prefill engine (P) a finished request's blocks go to `KVCacheManager.hold_for_transfer`,
which keeps exactly what the P/D plan names; the transfer server is told that this request's
reader may have those blocks until its lease ends. When the decode engine has verified its
read, released the request, or the lease expires, the blocks are freed (on the engine thread,
in `poll`).

On a decode engine (D) a `KVLoad` (what the plan leaves to receive after local reuse and shared
in-flight loads) becomes one read from P: the plan on both sides pairs P's held blocks with D's
receive list by block index. A request that needs nothing from P releases P's lease at once.

The transfer parameters P returns (and the router hands to D) are:

    {"do_remote_prefill": true, "remote_request_id": str, "remote_engine_id": str,
     "source": <KVSourceDescriptor as a dict>, "remote_num_tokens": N, "pd_policy": str,
     "sibling_reach": int (tokens, kvcache/pd_plan.py),
     "lease_seconds": float, "remote_block_ids": [[[block_index, block_id], ...] per group],
     "block_hashes": [[hex, ...] per group], "destination_engine_id": str | None,
     "expires_at": float, "grant_signature": hex}

signed by P with the cluster secret and checked by D against its own prompt (grant.py).

While such a request waits for admission on D (a busy decode engine), D sends P keep-alives
every third of the lease, so P never frees pages D is about to read.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from relaykv.engine.request import Request
from relaykv.kvcache import CacheRequest, KVCacheManager, KVLoad
from relaykv.transfer.grant import GrantSigner, prompt_block_hashes
from relaykv.transfer.transport import (
    KVSourceDescriptor,
    KVTransport,
    PageCopy,
    PageLayout,
    TransferHandle,
    TransportOptions,
)
from relaykv.transfer.transport.wire.auth import default_secret

log = logging.getLogger(__name__)

PARAM_KEYS = (
    "remote_request_id", "source", "remote_num_tokens", "pd_policy", "sibling_reach",
    "remote_block_ids",
)


class PDConnector:
    """`KVConnector` for one engine in a P/D pair (`role` is `prefill` or `decode`)."""

    def __init__(
        self,
        role: str,
        manager: KVCacheManager,
        transport: KVTransport,
        buffer: Any,
        *,
        engine_id: str,
        options: TransportOptions | None = None,
        lease_seconds: float = 30.0,
        quarantine_seconds: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`clock` measures leases, keep-alives and quarantines (tests pass a manual one; the
        transport's own grant table reads lease deadlines on the same monotonic clock)."""
        if role not in ("prefill", "decode"):
            raise ValueError(f"a P/D connector needs role prefill or decode, got {role!r}")
        if lease_seconds <= 0:
            raise ValueError("lease_seconds must be > 0")
        self.role = role
        self.manager = manager
        self.engine_id = engine_id
        self.lease_seconds = lease_seconds
        self.quarantine_seconds = quarantine_seconds
        self.clock = clock
        self.layout = PageLayout.from_geometry(manager.geometry, manager.pool.num_blocks)
        secret = options.secret if options is not None else None
        self.signer = GrantSigner(default_secret() if secret is None else secret)
        self.server = None
        self.client = None
        if role == "prefill":
            self.server = transport.create_server(
                buffer, self.layout, engine_id=engine_id, options=options
            )
        else:
            self.client = transport.create_client(
                buffer, self.layout, engine_id=engine_id, options=options
            )
        self._held: dict[str, CacheRequest] = {}
        self._reads: dict[str, tuple[TransferHandle, KVLoad]] = {}
        # Failed loads whose destination a push transport may still be writing: their
        # blocks stay allocated (the load stays pending) until the quarantine ends.
        self._quarantine: list[tuple[float, KVLoad]] = []
        self._kept_alive: dict[str, float] = {}  # D: request id -> last keep-alive sent

    # -- checks (the engine calls this while validating a request) ----------------------
    def validate(
        self, params: dict[str, Any], prompt_ids: Sequence[int], cache_salt: str | None = None
    ) -> None:
        """Raise ValueError for transfer parameters this engine cannot act on: on D, any
        not signed by a P of this cluster for exactly this prompt (grant.py)."""
        if params.get("do_remote_decode"):
            if self.role != "prefill":
                raise ValueError("this engine does not send KV (it is not a prefill engine)")
            destination = params.get("destination_engine_id")
            if destination is not None and not isinstance(destination, str):
                raise ValueError("destination_engine_id must be a string")
            return
        if not params.get("do_remote_prefill"):
            return
        if self.role != "decode":
            raise ValueError("this engine does not receive KV (it is not a decode engine)")
        missing = [k for k in PARAM_KEYS if k not in params]
        if missing:
            raise ValueError(f"kv_transfer_params lacks {', '.join(missing)}")
        self.signer.check(
            params, engine_id=self.engine_id, manager=self.manager, prompt=prompt_ids,
            salt=cache_salt,
        )
        if params["pd_policy"] != self.manager.pd_policy:
            raise ValueError(
                f"the prefill engine planned with --pd-policy {params['pd_policy']}, this decode "
                f"engine uses {self.manager.pd_policy} (both must match)"
            )
        if params["sibling_reach"] != self.manager.sibling_reach:
            raise ValueError(
                f"the prefill engine planned with --sibling-reach {params['sibling_reach']}, "
                f"this decode engine uses {self.manager.sibling_reach} (both must match)"
            )
        source = KVSourceDescriptor.from_dict(params["source"])
        if not source.page_layout.same_pages(self.layout):
            raise ValueError("the prefill engine's KV pages differ from this engine's (geometry)")
        blocks = params["remote_block_ids"]
        if not isinstance(blocks, list) or len(blocks) != self.manager.geometry.num_groups:
            raise ValueError("remote_block_ids must hold one list per KV group")

    # -- prefill side ---------------------------------------------------------------------
    def prefill_finished(self, request: Request) -> dict[str, Any] | None:
        assert self.server is not None and request.cache is not None
        held = self.manager.hold_for_transfer(request.cache)
        blocks = {g: [b for _, b in items] for g, items in enumerate(held) if items}
        destination = (request.kv_transfer_params or {}).get("destination_engine_id")
        deadline = self.clock() + self.lease_seconds
        if destination is None:  # bound to the first engine that reads it
            self.server.allow(request.request_id, blocks, deadline)
        else:
            self.server.allow(request.request_id, blocks, deadline, reader=destination)
        self._held[request.request_id] = request.cache
        prompt = request.prompt_ids
        params = {
            "do_remote_prefill": True,
            "remote_request_id": request.request_id,
            "remote_engine_id": self.engine_id,
            "source": self.server.descriptor.to_dict(),
            "remote_num_tokens": request.num_prompt_tokens,
            "pd_policy": self.manager.pd_policy,
            "sibling_reach": self.manager.sibling_reach,
            "lease_seconds": self.lease_seconds,
            "remote_block_ids": [[[k, b] for k, b in items] for items in held],
            "block_hashes": prompt_block_hashes(self.manager, prompt, request.cache_salt, held),
            "destination_engine_id": destination,
        }
        return self.signer.sign(params, self.lease_seconds)

    def _release_held(self, request_id: str, expired: bool) -> None:
        cache = self._held.pop(request_id, None)
        if cache is None:
            return
        assert self.server is not None
        self.server.release(request_id)  # returns once no copy of its pages is running
        self.manager.release(cache)
        if expired:
            self.manager.stats.lease_expiries += 1

    # -- decode side ----------------------------------------------------------------------
    def start_load(self, request: Request, load: KVLoad) -> None:
        assert self.client is not None and request.kv_transfer_params is not None
        params = request.kv_transfer_params
        source = KVSourceDescriptor.from_dict(params["source"])
        held = [[(int(k), int(b)) for k, b in group] for group in params["remote_block_ids"]]
        pages = [
            PageCopy(g, p_block, d_block, self.layout.page_bytes[g])
            for g, pairs in enumerate(load.transfer_pairs(held))
            for p_block, d_block in pairs
        ]
        handle = self.client.start_read(source, params["remote_request_id"], pages)
        self._reads[handle.transfer_id] = (handle, load)

    def release_remote(self, request: Request) -> None:
        """Tell P this request will not read (everything was reused locally, or it ended)."""
        assert self.client is not None and request.kv_transfer_params is not None
        params = request.kv_transfer_params
        self.client.release_remote(
            KVSourceDescriptor.from_dict(params["source"]), params["remote_request_id"]
        )

    def keep_alive(self, waiting: list[Request]) -> None:
        """D: renew the leases of remote-prefill requests still waiting for admission."""
        assert self.client is not None
        now = self.clock()
        alive = {}
        for request in waiting:
            params = request.kv_transfer_params or {}
            rid = request.request_id
            last = self._kept_alive.get(rid, now)
            alive[rid] = last
            if now - last >= float(params.get("lease_seconds", 30.0)) / 3:
                self.client.keep_alive(
                    KVSourceDescriptor.from_dict(params["source"]), params["remote_request_id"]
                )
                alive[rid] = now
        self._kept_alive = alive

    # -- both ---------------------------------------------------------------------------
    def poll(self) -> list[tuple[KVLoad, bool]]:
        if self.server is not None:
            for event in self.server.events():
                if event.kind == "read_ok":
                    self.manager.stats.kv_bytes_sent += event.nbytes
                if event.kind in ("read_ok", "read_failed", "released", "expired"):
                    self._release_held(event.request_id, expired=event.kind == "expired")
                elif event.kind == "keepalive" and event.request_id in self._held:
                    self.server.extend(event.request_id, self.clock() + self.lease_seconds)
        done: list[tuple[KVLoad, bool]] = []
        if self.client is None:
            return done
        now = self.clock()
        for handle in self.client.completed():
            entry = self._reads.pop(handle.transfer_id, None)
            if entry is None:
                continue
            if handle.status == "done":
                done.append((entry[1], True))
                continue
            exc = handle.exception()
            log.warning("KV read for %s failed: %r", handle.request_id, exc)
            # D will not retry this read: P may free the blocks now, not at lease expiry.
            self.client.release_remote(handle.source, handle.request_id)
            if getattr(exc, "dst_quiesced", True):
                done.append((entry[1], False))
            else:
                self._quarantine.append((now + self.quarantine_seconds, entry[1]))
        due = [load for deadline, load in self._quarantine if deadline <= now]
        self._quarantine = [(d, load) for d, load in self._quarantine if d > now]
        done.extend((load, False) for load in due)
        return done

    def check(self) -> list[str]:
        """Violations of the connector's invariants (tests run this after every step)."""
        problems = []
        for rid, cache in self._held.items():
            if self.manager.requests.get(rid) is not cache:
                problems.append(f"held request {rid} is not registered with the cache")
        for tid, (_, load) in self._reads.items():
            if not load.pending:
                problems.append(f"read {tid} still tracked after its load {load.state.value}")
        for _, load in self._quarantine:
            if not load.pending:
                problems.append(f"quarantined load {load.load_id} already {load.state.value}")
        # The transport's own structures belong to its IO thread; its tests check them.
        return problems

    def shutdown(self) -> None:
        if self.server is not None:
            self.server.close()
        if self.client is not None:
            self.client.close()
