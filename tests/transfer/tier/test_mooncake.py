"""The Mooncake Store tier (`relaykv.transfer.tier.mooncake`, docs/tier.md "Mooncake Store").

Without the library: object names and tags (`store_keys.py`), and the backend's jobs,
probes, health handling and marker over an in-memory client with Mooncake's calling
conventions and its placement (a put goes to the preferred segment when it is mounted, else
to any segment that is): after a master restart no put lands in another engine's segment
before this engine's own is mounted again.
With it (skipped with the reason and the install command otherwise): two engines' tiers
as clients of a real `mooncake_master`: what one stores the other finds and loads; closing a
client leaves none of its objects behind; a killed master fails jobs at once with a warning
and the tiers serve on, and a restarted one takes stores and serves hits again; restarted
while another client is mounted first, every store reported done sits in its own segment.
"""

from __future__ import annotations

import ctypes
import logging
import time
from collections.abc import Sequence
from types import SimpleNamespace

import httpx
import numpy as np
import pytest
import torch

from relaykv.kvcache.tier import JobKind, SharedTierBackend, TierCopy, TierJob
from relaykv.transfer.tier.mooncake import MooncakeTier, mooncake_unavailable
from relaykv.transfer.tier.registry import backend_names
from relaykv.transfer.tier.store_keys import MARKER_PREFIX, TAG_BYTES, StoreKeys

SECRET = b"s" * 32


def test_names_separate_salts_groups_models_and_clusters() -> None:
    keys = StoreKeys(SECRET, "tiny-hybrid|layout")
    name = keys.name(0, b"k" * 16)
    assert name.startswith("relaykv/") and b"k".hex() not in name
    assert name == StoreKeys(SECRET, "tiny-hybrid|layout").name(0, b"k" * 16)
    assert keys.name(1, b"k" * 16) != name  # another group
    assert keys.name(0, b"j" * 16) != name  # another block key (tokens or cache salt)
    assert StoreKeys(SECRET, "other-model|layout").name(0, b"k" * 16) != name
    assert StoreKeys(b"t" * 32, "tiny-hybrid|layout").name(0, b"k" * 16) != name
    tag = keys.tag(name, b"bytes")
    assert keys.verify(name, b"bytes", tag)
    assert not keys.verify(name, b"bytez", tag)
    assert not keys.verify(keys.name(1, b"k" * 16), b"bytes", tag)  # moved to another name


def test_cache_salt_changes_the_block_key() -> None:
    from relaykv.kvcache import Geometry, GroupSpec, KVCacheManager

    m = KVCacheManager(Geometry((GroupSpec("full", 4),)), 16)
    a = m.add_request("a", list(range(8)), salt="tenant-a")
    b = m.add_request("b", list(range(8)), salt="tenant-b")
    assert a.keys(0)[0] != b.keys(0)[0]


class MemoryStore:
    """Objects by name, read and written through raw pointers as Mooncake's client does, in
    the segments the clients mounted."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.segment_of: dict[str, str] = {}
        self.mounted: list[str] = []
        self.health = 0  # 2: master unreachable

    def restart(self) -> None:
        """A new master: no object, and no segment until its client mounts it again."""
        self.objects.clear()
        self.segment_of.clear()
        self.mounted.clear()

    def objects_in(self, segment: str) -> list[str]:
        return [k for k, seg in self.segment_of.items() if seg == segment]


class MemoryClient:
    def __init__(self, store: MemoryStore, segment: str) -> None:
        self.store = store
        self.segment = segment
        self.closed = False
        self.calls = 0
        store.mounted.append(segment)

    def get_hostname(self) -> str:
        return self.segment

    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        return 0

    def batch_put_from(
        self, keys: list[str], buffer_ptrs: list[int], sizes: list[int], config: object = None
    ) -> list[int]:
        """Mooncake's placement: the preferred segment when mounted, else any mounted one;
        an existing name is left as it is (and reported done)."""
        self.calls += 1
        if self.store.health:
            return [-900] * len(keys)
        preferred = getattr(config, "preferred_segment", self.segment)
        mounted = self.store.mounted
        if not mounted:
            return [-200] * len(keys)
        where = preferred if preferred in mounted else mounted[0]
        for key, ptr, size in zip(keys, buffer_ptrs, sizes, strict=True):
            if key not in self.store.objects:
                self.store.objects[key] = ctypes.string_at(ptr, size)
                self.store.segment_of[key] = where
        return [0] * len(keys)

    def batch_get_replica_desc(self, keys: list[str]) -> dict[str, list[object]]:
        out: dict[str, list[object]] = {}
        for key in keys:
            if key in self.store.objects:
                buffer = SimpleNamespace(transport_endpoint="te-" + self.store.segment_of[key])
                memory = SimpleNamespace(buffer_descriptor=buffer)
                replica = SimpleNamespace(
                    is_memory_replica=lambda: True, get_memory_descriptor=lambda m=memory: m
                )
                out[key] = [replica]
        return out

    def batch_remove(self, keys: list[str], force: bool = False) -> list[int]:
        for key in keys:
            self.store.objects.pop(key, None)
            self.store.segment_of.pop(key, None)
        return [0] * len(keys)

    def batch_get_into(
        self, keys: list[str], buffer_ptrs: list[int], sizes: list[int]
    ) -> list[int]:
        self.calls += 1
        if self.store.health:
            return [-900] * len(keys)
        out = []
        for key, ptr, size in zip(keys, buffer_ptrs, sizes, strict=True):
            value = self.store.objects.get(key)
            if value is None:
                out.append(-704)
                continue
            ctypes.memmove(ptr, value, min(size, len(value)))
            out.append(len(value))
        return out

    def batch_is_exist(self, keys: list[str]) -> list[int]:
        self.calls += 1
        if self.store.health:
            return [-900] * len(keys)
        return [int(k in self.store.objects) for k in keys]

    def health_check(self) -> int:
        return self.store.health

    def close(self) -> int:
        self.closed = True
        for key in self.store.objects_in(self.segment):
            self.batch_remove([key])
        if self.segment in self.store.mounted:
            self.store.mounted.remove(self.segment)
        return 0


def _wait(tier: MooncakeTier, timeout: float = 20.0, jobs: int = 1) -> list[tuple[TierJob, bool]]:
    deadline = time.monotonic() + timeout
    done: list[tuple[TierJob, bool]] = []
    while time.monotonic() < deadline:
        done += tier.poll()
        if len(done) >= jobs:
            return done
        time.sleep(0.002)
    raise AssertionError("the tier never finished the job")


def _job(job_id: int, kind: JobKind, copies: Sequence[tuple[int, bytes, int]]) -> TierJob:
    return TierJob(job_id, kind, tuple(TierCopy(g, k, 0, b) for g, k, b in copies))


def _pair(make_client) -> tuple[torch.Tensor, torch.Tensor, MooncakeTier, MooncakeTier]:
    kv_a = torch.randint(0, 255, (8, 64), dtype=torch.uint8)
    kv_b = torch.zeros((8, 64), dtype=torch.uint8)
    keys = StoreKeys(SECRET, "tiny|layout")
    a = MooncakeTier(kv_a, 16, make_client("a"), keys, probe_timeout=5.0)
    b = MooncakeTier(kv_b, 16, make_client("b"), keys, probe_timeout=5.0)
    return kv_a, kv_b, a, b


def _exchange(kv_a, kv_b, a: MooncakeTier, b: MooncakeTier) -> None:
    """A stores two blocks; B probes, loads them into other blocks, byte for byte."""
    store = _job(0, JobKind.STORE, [(0, b"x" * 16, 5), (1, b"y" * 16, 2)])
    a.submit(store)
    assert _wait(a) == [(store, True)]
    assert b.probe([(0, b"x" * 16), (1, b"y" * 16), (0, b"y" * 16)]) == [True, True, False]
    load = _job(1, JobKind.LOAD, [(0, b"x" * 16, 1), (1, b"y" * 16, 7)])
    b.submit(load)
    assert _wait(b) == [(load, True)]
    assert torch.equal(kv_b[1], kv_a[5]) and torch.equal(kv_b[7], kv_a[2])


def test_roundtrip_between_engines_and_tampering_refused() -> None:
    store = MemoryStore()
    kv_a, kv_b, a, b = _pair(lambda seg: MemoryClient(store, seg))
    try:
        assert isinstance(b, SharedTierBackend) and "mooncake" in backend_names()
        _exchange(kv_a, kv_b, a, b)
        name = a.keys.name(0, b"x" * 16)
        value = bytearray(store.objects[name])
        assert len(value) == 64 + TAG_BYTES
        value[3] ^= 1
        store.objects[name] = bytes(value)  # a local user flips a bit of the stored block
        kv_b.zero_()
        load = _job(2, JobKind.LOAD, [(0, b"x" * 16, 1)])
        b.submit(load)
        assert _wait(b) == [(load, False)] and b.rejected_values == 1
        assert not kv_b.any()
        store.objects[name] = store.objects[a.keys.name(1, b"y" * 16)]  # another block's value
        b.submit(load)
        assert _wait(b) == [(load, False)] and b.rejected_values == 2
    finally:
        a.shutdown()
        b.shutdown()
    assert a.client.closed and b.client.closed  # type: ignore[attr-defined]


def test_lost_master_fails_fast_warns_once_and_recovers(caplog) -> None:
    store = MemoryStore()
    kv_a, kv_b, a, b = _pair(lambda seg: MemoryClient(store, seg))
    try:
        store.health = 2
        caplog.set_level(logging.WARNING)
        calls = b.client.calls  # type: ignore[attr-defined]
        assert b.probe([(0, b"x" * 16)]) == [False]
        load = _job(0, JobKind.LOAD, [(0, b"x" * 16, 1)])
        b.submit(load)
        b.submit(load)
        assert _wait(b, jobs=2) == [(load, False), (load, False)]
        assert b.client.calls == calls  # type: ignore[attr-defined]  # nothing reached the client
        lost = [r for r in caplog.records if "unreachable" in r.getMessage()]
        assert len(lost) == 1 and b.epoch == 1
        store.health = 0
        store.restart()  # a new master starts empty; both segments are mounted again
        store.mounted += ["a", "b"]
        _exchange(kv_a, kv_b, a, b)
        assert any("is back" in r.getMessage() for r in caplog.records)
        assert b.epoch == 3  # back, and its marker gone (the index is forgotten)
    finally:
        a.shutdown()
        b.shutdown()


def test_no_put_lands_in_another_segment_before_its_own_is_back(caplog) -> None:
    """A restarted master mounts each client's segment when that client's heartbeat finds it;
    in between, Mooncake places a put whose own segment is missing in another one, where it
    would die with that engine (a later reader: TRANSFER_FAIL). The marker keeps puts back."""
    store = MemoryStore()
    kv_a, kv_b, a, b = _pair(lambda seg: MemoryClient(store, seg))
    try:
        _exchange(kv_a, kv_b, a, b)
        caplog.set_level(logging.WARNING)
        store.restart()  # too quick for the health check: the clients stay healthy
        store.mounted.append("b")  # B's heartbeat came first
        epoch = a.epoch
        put = _job(7, JobKind.STORE, [(0, b"w" * 16, 4)])
        a.submit(put)
        assert _wait(a) == [(put, False)]
        assert store.objects_in("b") == []  # A's marker, put there, was taken back
        assert a.epoch == epoch + 1  # the marker's loss told A its index is stale
        assert any("no longer holds" in r.getMessage() for r in caplog.records)
        assert not b.probe([(0, b"w" * 16)])[0]

        store.mounted.append("a")  # A's heartbeat remounted its segment
        a.submit(put)
        assert _wait(a) == [(put, True)]
        name = a.keys.name(0, b"w" * 16)
        assert store.segment_of[name] == "a" and store.segment_of[a.keys.marker("a")] == "a"
        assert b.probe([(0, b"w" * 16)]) == [True]
        load = _job(8, JobKind.LOAD, [(0, b"w" * 16, 0)])
        b.submit(load)
        assert _wait(b) == [(load, True)] and torch.equal(kv_b[0], kv_a[4])
        calls = a.client.calls  # type: ignore[attr-defined]
        a.submit(put)  # already in the store: nothing is copied again
        assert _wait(a) == [(put, True)] and a.client.calls == calls + 1  # type: ignore[attr-defined]
        assert all(k.startswith(MARKER_PREFIX) for k in store.objects_in("b"))
    finally:
        a.shutdown()
        b.shutdown()
    assert store.objects == {}  # closing took each engine's objects and marker with it


needs_mooncake = pytest.mark.skipif(
    mooncake_unavailable() is not None, reason=str(mooncake_unavailable())
)


@needs_mooncake
def test_real_master_share_close_kill_restart(tmp_path, caplog) -> None:
    from relaykv.transfer.tier.mooncake import connect_store
    from relaykv.transfer.tier.store_master import MasterPorts, start_master

    ports = MasterPorts.free()
    master = start_master(ports, tmp_path / "master.log")
    tiers: list[MooncakeTier] = []
    try:
        kv_a, kv_b, a, b = _pair(lambda seg: connect_store(ports.address, 4 << 20))
        tiers += [a, b]
        _exchange(kv_a, kv_b, a, b)
        a.shutdown()  # A's segment goes, with every object A put
        tiers.remove(a)
        assert b.probe([(0, b"x" * 16), (1, b"y" * 16)]) == [False, False]

        caplog.set_level(logging.WARNING)
        master.proc.kill()  # type: ignore[union-attr]
        master.proc.wait()  # type: ignore[union-attr]
        deadline = time.monotonic() + 30
        load = _job(3, JobKind.LOAD, [(0, b"x" * 16, 1)])
        while b.epoch == 0 and time.monotonic() < deadline:
            b.submit(load)
            assert _wait(b, 30) == [(load, False)]
        assert b.epoch == 1 and any("unreachable" in r.getMessage() for r in caplog.records)
        started = time.monotonic()
        b.submit(load)
        assert _wait(b) == [(load, False)] and time.monotonic() - started < 1.0  # fails fast
        assert b.probe([(0, b"x" * 16)]) == [False]

        master = start_master(ports, tmp_path / "master.log")
        kv_c = torch.randint(0, 255, (8, 64), dtype=torch.uint8)
        c = MooncakeTier(kv_c, 16, connect_store(ports.address, 4 << 20), b.keys, 5.0)
        tiers.append(c)
        deadline = time.monotonic() + 30
        while b.probe([(0, b"z" * 16)]) != [False] or b.epoch < 2:
            assert time.monotonic() < deadline, "the client never saw the master back"
            time.sleep(0.2)
        store = _job(4, JobKind.STORE, [(0, b"z" * 16, 3)])
        c.submit(store)
        assert _wait(c) == [(store, True)]
        assert b.probe([(0, b"z" * 16)]) == [True]
        load = _job(5, JobKind.LOAD, [(0, b"z" * 16, 6)])
        b.submit(load)
        assert _wait(b) == [(load, True)]
        assert np.array_equal(kv_b[6].numpy(), kv_c[3].numpy())
    finally:
        for tier in tiers:
            tier.shutdown()
        master.stop(10)


@needs_mooncake
def test_real_master_restarted_puts_stay_in_their_own_segment(tmp_path) -> None:
    """Restarted, a master mounts a new client's segment at its setup and a running client's
    when that client's heartbeat finds it, a second or two later, while the client's health
    check already says healthy. A stores all along from the restart on, once after a quick
    restart and once after an outage it noticed and waited out: every store it reports done
    sits in its own segment (where its stores went before the restart), none in the new
    client's, and A knew its index was stale; the store lists what A stored since the
    restart and A's marker, nothing older."""
    from relaykv.transfer.tier.mooncake import RETRY_S, connect_store
    from relaykv.transfer.tier.store_master import MasterPorts, start_master

    def endpoints(client, names: list[str]) -> list[list[str]]:
        descs = client.batch_get_replica_desc(names)
        return [
            [r.get_memory_descriptor().buffer_descriptor.transport_endpoint for r in descs[n]]
            for n in names
        ]

    ports = MasterPorts.free()
    master = start_master(ports, tmp_path / "master.log")
    kv = torch.randint(0, 255, (8, 64), dtype=torch.uint8)
    a = MooncakeTier(kv, 16, connect_store(ports.address, 4 << 20), StoreKeys(SECRET, "t"), 5.0)
    others = []
    try:
        first = _job(0, JobKind.STORE, [(0, b"before".ljust(16), 1)])
        a.submit(first)
        assert _wait(a) == [(first, True)]
        [[own]] = endpoints(a.client, [a.keys.name(0, b"before".ljust(16))])
        job_id = 1
        for cycle, outage in enumerate((0.0, RETRY_S + 1.5)):
            epoch = a.epoch
            master.proc.kill()  # type: ignore[union-attr]
            master.proc.wait()  # type: ignore[union-attr]
            if outage:  # A notices (a failed call), and its pause after that ends
                lost = _job(job_id, JobKind.LOAD, [(0, b"before".ljust(16), 2)])
                job_id += 1
                a.submit(lost)
                assert _wait(a, 30) == [(lost, False)]
                time.sleep(outage)
            master = start_master(ports, tmp_path / "master.log")
            others.append(connect_store(ports.address, 4 << 20))  # mounted before A's remount
            stored: list[str] = []
            deadline = time.monotonic() + 20
            while len(stored) < 3:
                assert time.monotonic() < deadline, "A's stores never resumed"
                key = f"{cycle}-{job_id}".encode().ljust(16)
                job = _job(job_id, JobKind.STORE, [(0, key, job_id % 8)])
                job_id += 1
                a.submit(job)
                [(_, ok)] = _wait(a)
                if ok:
                    stored.append(a.keys.name(0, key))
                time.sleep(0.01)
            assert endpoints(a.client, stored) == [[own]] * len(stored)
            assert a.epoch > epoch
            detail = httpx.get(f"http://127.0.0.1:{ports.admin}/get_segments_detail").json()
            used = {s["te_endpoint"]: s["allocator_used_bytes"] for s in detail["segments"]}
            assert used.pop(own) > 0 and set(used.values()) == {0}  # nothing of A elsewhere
            # Nothing from before the restart is left, nor a marker put in the wrong place.
            listed = httpx.get(f"http://127.0.0.1:{ports.admin}/get_all_keys").text.split()
            assert sorted(listed) == sorted([*stored, a.keys.marker(a.client.get_hostname())])
    finally:
        a.shutdown()
        for client in others:
            client.close()
        master.stop(10)
