"""The shared tier: Mooncake Store (`--kv-offloading-backend mooncake`, docs/tier.md).

Every engine of a cluster is a client of one `mooncake_master` (`--kv-store-master
HOST:PORT`, P2P handshake: no metadata server) and lends the store `--kv-offloading-size`
GiB of its host memory (its segment). A block is one object, named and tagged with keys
derived from the cluster secret (`store_keys.py`); a store puts it into this engine's own
segment (an engine that dies takes only its own puts with it), a load gets it from
whichever segment holds it and checks its tag before the bytes reach the KV pages.

Threads: one worker runs the jobs in order through a registered staging buffer (copy the
pages in, tag, `batch_put_from`; `batch_get_into`, check, copy the pages out), so the KV
pages themselves are never registered with Mooncake's transfer engine. A second thread
answers `probe` (which blocks the store holds, `batch_is_exist`), which the step thread
waits for at most `probe_timeout` seconds: a lookup never stalls on a slow master.

The master may die. `health_check()` (local, instant) is asked before every call, and a call
that finds no master marks it lost for a few seconds (Mooncake's health check notices only
after some missed pings). While it is lost, jobs fail at once (a load's request computes,
or asks its prefill engine; a store is dropped) and probes find nothing; each change is
logged once (a warning when the master is lost) and bumps `epoch`, upon which the cache
forgets what it believed the store held (a restarted master starts empty).

A restarted master knows no segment until each client's heartbeat finds it and remounts its
segment, a second or so later, each client on its own schedule; meanwhile the client's
health check already says healthy, and Mooncake places a put whose preferred segment is not
mounted in any segment that is (its preference is best effort). A put in that window would
land in another engine's segment and die with that engine: a reader then gets
`TRANSFER_FAIL` from the dead segment (or a miss once its TTL dropped it). So each engine
keeps a *marker*, a one-byte hard-pinned object, in its own segment, and asks for it in the
same `batch_is_exist` that every put and probe sends anyway. Present: this master has this
engine's segment mounted (a segment's objects go when it is unmounted). Missing: the master
restarted (or dropped the segment), which bumps `epoch` even when the restart was too quick
for the health check to notice, and no put is sent until the worker has put the marker again
and found it in this engine's own segment (its transfer endpoint, learnt from the marker put
at setup, when setup had just mounted the segment); a marker that landed elsewhere is removed
and the store job fails (the checkpoint is stored by a later request). A put also skips the
blocks the store already holds. Left open: a master that dies and comes back between the
check and the put (a few microseconds apart) could still misplace that one put; and a put
whose own segment is full spills into another segment, as Mooncake places it (the master
manages the store's memory; such a block dies with that segment's engine, and a load of it
then fails and is computed or asked of P).
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
import torch

from relaykv.kvcache.tier import JobKind, TierCopy, TierJob
from relaykv.transfer.tier.base import TierRequest, drain
from relaykv.transfer.tier.store_keys import TAG_BYTES, StoreKeys

log = logging.getLogger(__name__)

INSTALL_HINT = (
    "apt-get install -y libibverbs1 && pip install mooncake-transfer-engine-non-cuda==0.3.13.post1"
)
LOCAL_BUFFER_BYTES = 16 << 20  # the client's own transfer buffer (we use registered memory)
MIN_SEGMENT_BYTES = 16 << 20  # Mooncake refuses a smaller segment
STAGING_BYTES = 32 << 20  # the worker's staging buffer, at least one block
HEALTHY = 0
MASTER_LOST = {-900}  # Mooncake's RPC_FAIL: the master did not answer
RETRY_S = 3.0  # after a call found the master gone, how long before the store is tried again
MARKER_BYTES = 1
REMARK = "remark"  # a worker queue item: put the marker again (a probe found it missing)


class StoreClient(Protocol):
    """What the tier uses of `mooncake.store.MooncakeDistributedStore` (set up)."""

    def get_hostname(self) -> str: ...
    def register_buffer(self, buffer_ptr: int, size: int) -> int: ...
    def batch_put_from(
        self, keys: list[str], buffer_ptrs: list[int], sizes: list[int], config: Any = ...
    ) -> list[int]: ...
    def batch_get_into(
        self, keys: list[str], buffer_ptrs: list[int], sizes: list[int]
    ) -> list[int]: ...
    def batch_is_exist(self, keys: list[str]) -> list[int]: ...
    def batch_get_replica_desc(self, keys: list[str]) -> dict[str, list[Any]]: ...
    def batch_remove(self, keys: list[str], force: bool = ...) -> list[int]: ...
    def health_check(self) -> int: ...
    def close(self) -> int: ...


def mooncake_unavailable() -> str | None:
    """None when the store client imports, else why not (with the install command)."""
    try:
        from mooncake.store import MooncakeDistributedStore  # noqa: F401
    except Exception as exc:  # ImportError, or the shared library's OSError
        return f"mooncake store not importable ({exc}); install: {INSTALL_HINT}"
    return None


def connect_store(master: str, segment_bytes: int) -> StoreClient:
    """A Mooncake Store client of `master` lending `segment_bytes` of this process's memory."""
    from mooncake.store import MooncakeDistributedStore

    host = master.rsplit(":", 1)[0] or "127.0.0.1"
    client = MooncakeDistributedStore()
    segment = max(segment_bytes, MIN_SEGMENT_BYTES)
    rc = client.setup(host, "P2PHANDSHAKE", segment, LOCAL_BUFFER_BYTES, "tcp", "", master)
    if rc != 0:
        raise ConnectionError(f"Mooncake Store setup with master {master} failed ({rc})")
    return client


class MooncakeTier:
    """`TierBackend` over a Mooncake Store; key-addressed (`TierCopy.group`, `.key`)."""

    name = "mooncake"
    medium = "CPU"  # the store's memory is host memory

    def __init__(
        self,
        kv_buffer: Any,
        capacity_blocks: int,
        client: StoreClient,
        keys: StoreKeys,
        probe_timeout: float = 0.25,
        master: str = "",
    ) -> None:
        if not isinstance(kv_buffer, torch.Tensor):
            kv_buffer = torch.from_numpy(kv_buffer)
        if kv_buffer.dim() != 2:
            raise ValueError("the KV buffer must be [num_blocks, block_bytes]")
        self.kv = kv_buffer
        self._kv_np = None if kv_buffer.is_cuda else kv_buffer.numpy()
        self.block_bytes = int(kv_buffer.shape[1]) * kv_buffer.element_size()
        self.row_bytes = self.block_bytes + TAG_BYTES
        self.capacity_blocks = capacity_blocks
        self.client = client
        self.keys = keys
        self.master = master
        self.probe_timeout = probe_timeout
        rows = max(1, STAGING_BYTES // self.row_bytes)
        self._stage = np.zeros((rows, self.row_bytes), dtype=np.uint8)
        rc = client.register_buffer(self._stage.ctypes.data, self._stage.nbytes)
        if rc != 0:
            raise ConnectionError(f"Mooncake Store register_buffer failed ({rc})")
        self._segment = client.get_hostname()
        self._put_config = self._config()
        self._marker_config = self._config(pinned=True)
        self._marker = keys.marker(self._segment)
        self.epoch = 0  # bumped on every change of the master's health, and on a lost marker
        self._healthy = True
        self._retry_at = 0.0
        self._health_lock = threading.Lock()
        self._endpoint = ""  # where this engine's segment is reached (learnt from the marker)
        self._marked = False  # the master holds the marker in this engine's segment
        self._marks = 0  # markers placed so far (an answer older than the last one is stale)
        self._remark_queued = False
        if not self._place_marker():
            raise ConnectionError(f"Mooncake Store master {master}: could not place the marker")
        self._marked = True
        self.bytes_stored = 0
        self.bytes_loaded = 0
        self.rejected_values = 0  # loads refused: a tag that did not verify
        self._jobs: queue.SimpleQueue[TierJob | str | None] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[tuple[TierJob, bool]] = queue.SimpleQueue()
        self._prober = concurrent.futures.ThreadPoolExecutor(1, "relaykv-kv-store-probe")
        self._probing: concurrent.futures.Future[list[bool]] | None = None
        self._thread = threading.Thread(target=self._run, name="relaykv-kv-store", daemon=True)
        self._thread.start()

    # -- the step thread -----------------------------------------------------------------
    def submit(self, job: TierJob) -> None:
        self._jobs.put(job)

    def poll(self) -> list[tuple[TierJob, bool]]:
        return drain(self._done)

    def probe(self, items: Sequence[tuple[int, bytes]]) -> list[bool]:
        """Which of `(group, key)` the store holds now; all False when the master is
        unreachable or does not answer within `probe_timeout` (a lookup then misses)."""
        if not items or not self._check_health():
            return [False] * len(items)
        if self._probing is not None and not self._probing.done():
            return [False] * len(items)  # the previous probe is still stuck in the client
        names = [self.keys.name(g, k) for g, k in items]
        self._probing = self._prober.submit(self._exist, names)
        try:
            return self._probing.result(timeout=self.probe_timeout)
        except concurrent.futures.TimeoutError:
            log.warning(
                "KV store master %s: no answer in %.2f s; treating the lookup as a miss",
                self.master,
                self.probe_timeout,
            )
            return [False] * len(items)

    def shutdown(self) -> None:
        """Stop the worker, then close the client: the master unmounts this engine's segment
        and drops every object in it (nothing of this engine outlives it)."""
        self._jobs.put(None)
        self._thread.join(timeout=10)
        self._prober.shutdown(wait=True, cancel_futures=True)
        rc = self.client.close()
        if rc != 0:
            log.warning("KV store: closing the client failed (%d)", rc)

    # -- health --------------------------------------------------------------------------
    def _check_health(self, failed_call: bool = False) -> bool:
        """Whether to use the store now. A call that failed for want of the master marks it
        lost at once and for `RETRY_S` (Mooncake's own health check notices a dead master
        only after a few missed pings, and each call meanwhile takes seconds to fail);
        after that, its health check decides."""
        now = time.monotonic()
        if failed_call:
            self._retry_at = now + RETRY_S
            ok = False
        elif now < self._retry_at:
            ok = False
        else:
            ok = self.client.health_check() == HEALTHY
        with self._health_lock:
            if ok != self._healthy:
                self._healthy = ok
                self.epoch += 1
                if ok:
                    log.warning("KV store master %s is back: store hits resume", self.master)
                else:
                    log.warning(
                        "KV store master %s unreachable: serving without the store (misses "
                        "are computed or asked of a prefill engine) until it is back",
                        self.master,
                    )
        return ok

    def _exist(self, names: list[str]) -> list[bool]:
        marks = self._marks
        codes = self.client.batch_is_exist([self._marker, *names])
        if any(c in MASTER_LOST for c in codes):
            self._check_health(failed_call=True)
            return [False] * len(names)
        if codes[0] == 0:
            self._marker_missing(marks)
            with self._health_lock:
                queue_it, self._remark_queued = not self._remark_queued, True
            if queue_it:
                self._jobs.put(REMARK)
        return [c == 1 for c in codes[1:]]

    # -- the marker ----------------------------------------------------------------------
    def _marker_missing(self, marks: int) -> None:
        """The master answered without this engine's marker (asked when `marks` markers had
        been placed): it restarted (or dropped the segment), so what the cache believed the
        store held is gone."""
        with self._health_lock:
            if not self._marked or marks != self._marks:
                return
            self._marked = False
            self.epoch += 1
        log.warning(
            "KV store master %s no longer holds this engine's segment (restarted?): the "
            "store's blocks are forgotten; puts resume once the segment is mounted again",
            self.master,
        )

    def _place_marker(self) -> bool:
        """Put the marker; True when it sits in this engine's own segment (the first call,
        right after setup mounted the segment, learns where that is)."""
        ptr = self._stage.ctypes.data
        if self._marker_config is None:
            codes = self.client.batch_put_from([self._marker], [ptr], [MARKER_BYTES])
        else:
            codes = self.client.batch_put_from(
                [self._marker], [ptr], [MARKER_BYTES], self._marker_config
            )
        if codes != [0]:
            self._note_failure(codes, "marker put")
            return False
        where = self._endpoints([self._marker]).get(self._marker, [])
        if not self._endpoint and len(where) == 1:
            self._endpoint = where[0]
        if where == [self._endpoint]:
            return True
        self.client.batch_remove([self._marker], True)
        return False

    def _remark(self) -> bool:
        """Whether this engine's segment is mounted on the master (the marker put again and
        found there); puts wait for it."""
        with self._health_lock:
            self._remark_queued = False
            if self._marked:
                return True
        if not self._place_marker():
            log.info("KV store: this engine's segment is not mounted again yet; put dropped")
            return False
        with self._health_lock:
            self._marked = True
            self._marks += 1
        log.warning("KV store master %s: this engine's segment is back: puts resume", self.master)
        return True

    def _endpoints(self, names: list[str]) -> dict[str, list[str]]:
        """Where each object's memory replicas are (their transfer endpoints)."""
        descs = self.client.batch_get_replica_desc(names)
        return {
            name: [
                r.get_memory_descriptor().buffer_descriptor.transport_endpoint
                for r in replicas
                if r.is_memory_replica()
            ]
            for name, replicas in descs.items()
        }

    # -- the worker ----------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if isinstance(job, str):  # REMARK
                if self._check_health():
                    self._remark()
                continue
            ok = False
            if self._check_health():
                try:
                    ok = self._copy(job)
                except Exception:  # a failed job is reported, never raised into the engine
                    log.exception("KV store job %d failed", job.job_id)
            self._done.put((job, ok))

    def _copy(self, job: TierJob) -> bool:
        rows = self._stage.shape[0]
        copies = job.copies
        for start in range(0, len(copies), rows):
            chunk = copies[start : start + rows]
            done = self._store(chunk) if job.kind is JobKind.STORE else self._load(chunk)
            if not done:
                return False
        return True

    def _ptrs(self, n: int) -> tuple[list[int], list[int]]:
        base = self._stage.ctypes.data
        return [base + i * self.row_bytes for i in range(n)], [self.row_bytes] * n

    def _store(self, chunk: Sequence[TierCopy]) -> bool:
        names = [self.keys.name(c.group, c.key) for c in chunk]
        marks = self._marks
        codes = self.client.batch_is_exist([self._marker, *names])
        if any(c < 0 for c in codes):
            self._note_failure(codes, "exist")
            return False
        if codes[0] == 0:
            self._marker_missing(marks)
        if not self._remark():
            return False
        todo = [i for i, c in enumerate(codes[1:]) if c != 1]  # the rest is in the store
        chunk, names = [chunk[i] for i in todo], [names[i] for i in todo]
        n, bb = len(chunk), self.block_bytes
        if n == 0:
            return True
        stage = self._stage[:n]
        stage[:, :bb] = self._read_pages([c.block for c in chunk])
        for i, name in enumerate(names):
            stage[i, bb:] = np.frombuffer(self.keys.tag(name, stage[i, :bb].data), np.uint8)
        ptrs, sizes = self._ptrs(n)
        if self._put_config is None:
            codes = self.client.batch_put_from(names, ptrs, sizes)
        else:
            codes = self.client.batch_put_from(names, ptrs, sizes, self._put_config)
        if any(c != 0 for c in codes):
            self._note_failure(codes, "put")
            return False
        self.bytes_stored += n * bb
        return True

    def _load(self, chunk: Sequence[TierCopy]) -> bool:
        n, bb = len(chunk), self.block_bytes
        names = [self.keys.name(c.group, c.key) for c in chunk]
        ptrs, sizes = self._ptrs(n)
        codes = self.client.batch_get_into(names, ptrs, sizes)
        if any(c != self.row_bytes for c in codes):
            self._note_failure(codes, "get")
            return False
        stage = self._stage[:n]
        for i, name in enumerate(names):
            if not self.keys.verify(name, stage[i, :bb].data, stage[i, bb:].data):
                self.rejected_values += 1
                log.warning("KV store: a value under %s failed its tag; not loaded", name)
                return False
        self._write_pages([c.block for c in chunk], stage[:, :bb])
        self.bytes_loaded += n * bb
        return True

    def _note_failure(self, codes: Sequence[int], what: str) -> None:
        bad = [c for c in codes if c < 0]
        log.info("KV store %s failed for %d of %d blocks (%s)", what, len(bad), len(codes), bad[:1])
        if any(c in MASTER_LOST for c in bad):
            self._check_health(failed_call=True)

    def _config(self, pinned: bool = False) -> Any:
        """Puts go to this engine's own segment (it dies: only its own puts go with it);
        `pinned` (the marker): never evicted. None for a client that is not Mooncake's
        (tests)."""
        try:
            from mooncake.store import ReplicateConfig
        except Exception:  # not installed, or its shared library does not load
            return None
        config = ReplicateConfig()
        config.preferred_segment = self._segment
        config.with_hard_pin = pinned
        return config

    def _read_pages(self, blocks: list[int]) -> np.ndarray:
        if self._kv_np is not None:
            return self._kv_np[np.asarray(blocks, dtype=np.int64)].view(np.uint8)
        index = torch.as_tensor(blocks, device=self.kv.device)
        return self.kv[index].cpu().view(torch.uint8).numpy()

    def _write_pages(self, blocks: list[int], rows: np.ndarray) -> None:
        if self._kv_np is not None:
            self._kv_np.view(np.uint8)[np.asarray(blocks, dtype=np.int64)] = rows
            return
        index = torch.as_tensor(blocks, device=self.kv.device)
        self.kv.view(torch.uint8)[index] = torch.from_numpy(np.ascontiguousarray(rows)).to(
            self.kv.device
        )


Connect = Callable[[str, int], StoreClient]


def mooncake_tier(request: TierRequest, connect: Connect = connect_store) -> MooncakeTier:
    """The registry's factory: `settings` names `master` (HOST:PORT), `secret` (the cluster
    secret) and `namespace` (the served model and its KV layout)."""
    settings = request.settings
    master = settings["master"]
    block_bytes = request.geometry.block_bytes
    client = connect(master, request.capacity_blocks * (block_bytes + TAG_BYTES))
    keys = StoreKeys(settings["secret"], f"{settings['namespace']}|{request.geometry!r}")
    try:
        return MooncakeTier(request.kv_buffer, request.capacity_blocks, client, keys, master=master)
    except Exception:
        client.close()
        raise
