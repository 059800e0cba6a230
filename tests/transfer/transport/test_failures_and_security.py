"""Failure and security cases beyond the shared suite: unreachable and crashing peers,
misbehaving readers, release/expiry in the middle of a transfer, forged sinks."""

from __future__ import annotations

import dataclasses
import socket
import time

import msgspec
import numpy as np
import pytest
import torch
import zmq

from relaykv.transfer.transport import (
    FaultPlan,
    KVSourceDescriptor,
    LeaseExpired,
    PageCopy,
    PeerLost,
    PeerUnreachable,
    TransferError,
    TransferRefused,
    get_transport,
)
from relaykv.transfer.transport.planes.shm import ShmRegistration
from relaykv.transfer.transport.registry import transport_class
from relaykv.transfer.transport.serving.standalone import StandalonePeer, seeded_buffer
from relaykv.transfer.transport.wire import control
from relaykv.transfer.transport.wire.auth import MessageAuth, default_secret

from .conftest import LAYOUT, OPTIONS, SEED, transport_params

MOONCAKE_MISSING = transport_class("mooncake").availability()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def make_pair(name: str):
    transport = get_transport(name)
    src = seeded_buffer(LAYOUT, SEED)
    dst = np.zeros_like(src)
    server = transport.create_server(src, LAYOUT, engine_id="P", options=OPTIONS)
    client = transport.create_client(dst, LAYOUT, engine_id="D", options=OPTIONS)
    return server, client, src, dst


@pytest.mark.parametrize("name", transport_params())
def test_unreachable_peer_fails_fast(name: str) -> None:
    transport = get_transport(name)
    dst = np.zeros((LAYOUT.num_blocks, LAYOUT.block_bytes), dtype=np.uint8)
    with transport.create_client(dst, LAYOUT, engine_id="D", options=OPTIONS) as client:
        nobody = KVSourceDescriptor("ghost", name, "127.0.0.1", free_port(), LAYOUT.to_wire())
        start = time.monotonic()
        with pytest.raises(PeerUnreachable, match=r"could not connect|refused the connection"):
            client.read(nobody, "r", [PageCopy(0, 1, 2, 8192)], timeout_s=0.8)
        assert time.monotonic() - start < 2.0
        client.check_invariants()


@pytest.mark.parametrize("name", transport_params())
def test_a_refused_connection_fails_before_the_connect_deadline(name: str) -> None:
    """A dead P (nothing listens on its port) fails a read at once, not after the connect
    timeout (a hung P, which accepts connections, is what that deadline is for)."""
    transport = get_transport(name)
    dst = np.zeros((LAYOUT.num_blocks, LAYOUT.block_bytes), dtype=np.uint8)
    options = dataclasses.replace(OPTIONS, timeout_s=60.0, connect_timeout_s=60.0)
    with transport.create_client(dst, LAYOUT, engine_id="D", options=options) as client:
        nobody = KVSourceDescriptor("ghost", name, "127.0.0.1", free_port(), LAYOUT.to_wire())
        with pytest.raises(PeerUnreachable, match="refused the connection") as info:
            client.read(nobody, "r", [PageCopy(0, 1, 2, 8192)])
        assert info.value.dst_quiesced  # nothing was sent: no quarantine needed
        client.check_invariants()


@pytest.mark.parametrize("name", transport_params())
def test_peer_process_crash_mid_transfer_is_peer_lost(name: str) -> None:
    peer = StandalonePeer(name, LAYOUT, seed=SEED, chunk_bytes=OPTIONS.chunk_bytes)
    dst = np.zeros((LAYOUT.num_blocks, LAYOUT.block_bytes), dtype=np.uint8)
    client = get_transport(name).create_client(dst, LAYOUT, engine_id="D", options=OPTIONS)
    try:
        peer.allow("r", {0: [1, 2, 3, 4, 5, 6]})
        peer.call("inject", faults={"die_after_pages": 2, "exit_process": True})
        pages = [PageCopy(0, b, b + 10, 8192) for b in range(1, 7)]
        start = time.monotonic()
        with pytest.raises(PeerLost, match="dropped"):
            client.read(peer.descriptor, "r", pages, timeout_s=20)
        assert time.monotonic() - start < 5.0, "a crash must not cost the whole timeout"
        assert peer.proc.wait(timeout=5) == 17
        client.check_invariants()
    finally:
        client.close()
        peer.close()


@pytest.mark.parametrize("name", transport_params())
def test_release_and_expiry_in_the_middle_of_a_transfer(name: str) -> None:
    server, client, src, dst = make_pair(name)
    try:
        pages = [PageCopy(0, b, b + 10, 8192) for b in range(1, 9)]  # 4 chunks
        server.inject(FaultPlan(delay_s=0.15))
        server.allow("rel", {0: list(range(1, 9))}, time.monotonic() + 30)
        handle = client.start_read(server.descriptor, "rel", pages)
        time.sleep(0.2)
        assert server.release("rel") is True
        with pytest.raises(TransferRefused, match="released"):
            handle.result(timeout=10)
        server.allow("exp", {0: list(range(1, 9))}, time.monotonic() + 0.25)
        with pytest.raises(LeaseExpired):
            client.read(server.descriptor, "exp", pages)
        server.inject(None)
        server.allow("ok", {0: [1]}, time.monotonic() + 30)
        client.read(server.descriptor, "ok", [PageCopy(0, 1, 40, 8192)])
        assert np.array_equal(dst[40], src[1])
        kinds: set[str] = set()
        deadline = time.monotonic() + 5  # D's Ack reaches P just after read() returns
        while not {"read_failed", "read_ok", "expired"} <= kinds:
            assert time.monotonic() < deadline, kinds
            kinds |= {e.kind for e in server.events()}
            time.sleep(0.02)
        server.check_invariants()
        client.check_invariants()
    finally:
        client.close()
        server.close()


@pytest.mark.parametrize("name", transport_params())
def test_bad_reads_are_rejected_before_starting(name: str) -> None:
    server, client, _, _ = make_pair(name)
    try:
        other = "tcp" if name != "tcp" else "shm"
        forged = KVSourceDescriptor(
            "P", other, "127.0.0.1", server.descriptor.port, LAYOUT.to_wire()
        )
        with pytest.raises(ValueError, match="--kv-transport must match"):
            client.start_read(forged, "r", [PageCopy(0, 1, 2, 8192)])
        wrong = KVSourceDescriptor(
            "P", name, "127.0.0.1", server.descriptor.port, [64, 8192, 8192, 3072, 999]
        )
        with pytest.raises(ValueError, match="page sizes differ"):
            client.start_read(wrong, "r", [PageCopy(0, 1, 2, 8192)])
        with pytest.raises(ValueError, match="appears twice"):
            client.start_read(server.descriptor, "r", [PageCopy(0, 1, 2, 8192)] * 2)
        assert client.stats()["in_flight"] == 0
    finally:
        client.close()
        server.close()


def test_client_close_fails_what_is_in_flight() -> None:
    server, client, _, _ = make_pair("tcp")
    try:
        server.allow("r", {0: [1]}, time.monotonic() + 30)
        server.inject(FaultPlan(drop=True))
        handle = client.start_read(server.descriptor, "r", [PageCopy(0, 1, 2, 8192)])
        time.sleep(0.1)
        client.close()
        with pytest.raises(TransferError, match="closed"):
            handle.result(timeout=5)
    finally:
        server.close()


def raw_reader(server) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(server.descriptor.endpoint)
    return sock


def cluster_codec() -> control.Codec:
    """A codec holding the cluster secret (a member of the cluster, not an outsider)."""
    return control.Codec(MessageAuth(default_secret()))


def read_msg(tid: str, rid: str, pages: list, reader: str, sink: bytes = b"", window: int = 1,
             timeout_s: float = 2.0) -> control.Read:
    return control.Read(tid, rid, pages, sink, window, timeout_s, reader, time.time())


@pytest.mark.parametrize(
    "name, slots",
    [
        ("../../../etc/passwd", [0]),
        ("relaykv-" + "0" * 31 + "/", [0]),
        ("relaykv-" + "0" * 32, [0]),  # well formed, but no such staging area
    ],
)
def test_shm_server_only_opens_staging_areas(name: str, slots: list[int]) -> None:
    server, client, _, _ = make_pair("shm")
    sock = raw_reader(server)
    try:
        server.allow("r", {0: [1]}, time.monotonic() + 30)
        codec = cluster_codec()
        registration = msgspec.msgpack.encode(ShmRegistration(name, 16384))
        sock.send_multipart(codec.to_server(control.Register("evil", registration)))
        sink = msgspec.msgpack.encode({"slots": slots})
        sock.send_multipart(codec.to_server(read_msg("t1", "r", [(0, 1, 2, 8192)], "evil", sink)))
        assert sock.poll(5000)
        reply = codec.decode_to_client(*sock.recv_multipart())
        assert isinstance(reply, control.Refused) and "has not registered" in reply.reason
    finally:
        sock.close(0)
        client.close()
        server.close()


def test_reader_that_never_credits_does_not_stall_others() -> None:
    server, client, src, dst = make_pair("tcp")
    sock = raw_reader(server)
    try:
        server.allow("greedy", {0: list(range(1, 11))}, time.monotonic() + 30)
        server.allow("polite", {0: [20]}, time.monotonic() + 30)
        codec = cluster_codec()
        pages = [(0, b, b + 20, 8192) for b in range(1, 11)]
        sock.send_multipart(codec.to_server(control.Register("greedy", b"")))
        sock.send_multipart(
            codec.to_server(read_msg("t-greedy", "greedy", pages, "greedy", timeout_s=0.5))
        )
        assert sock.poll(5000)  # the first chunk arrives, and then nothing: no credit
        client.read(server.descriptor, "polite", [PageCopy(0, 20, 40, 8192)], timeout_s=5)
        assert np.array_equal(dst[40], src[20])
        deadline = time.monotonic() + 5
        while server.stats()["transfers_in_flight"]:
            assert time.monotonic() < deadline, "the stalled transfer was never dropped"
            time.sleep(0.05)
        server.check_invariants()
    finally:
        sock.close(0)
        client.close()
        server.close()


def test_torch_buffers_end_to_end() -> None:
    transport = get_transport("shm")
    src = torch.from_numpy(seeded_buffer(LAYOUT, 7))
    dst = torch.zeros_like(src)
    with (
        transport.create_server(src, LAYOUT, engine_id="P", options=OPTIONS) as server,
        transport.create_client(dst, LAYOUT, engine_id="D", options=OPTIONS) as client,
    ):
        server.allow("r", {1: [5, 6]}, time.monotonic() + 30)
        client.read(server.descriptor, "r", [PageCopy(1, 5, 9, 3072), PageCopy(1, 6, 10, 3072)])
        assert torch.equal(dst[9, :3072], src[5, :3072])
        assert torch.equal(dst[10, :3072], src[6, :3072])
        assert int(dst[9, 3072:].sum()) == 0


@pytest.mark.skipif(MOONCAKE_MISSING is not None, reason=f"mooncake: {MOONCAKE_MISSING}")
def test_mooncake_peer_cannot_read_p_memory() -> None:
    """P never registers its KV buffer, so Mooncake's server rejects any remote READ."""
    from mooncake.engine import TransferEngine

    server, client, src, _ = make_pair("mooncake")
    try:
        p_engine = server._plane._engine
        thief = TransferEngine()
        assert thief.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        loot = np.zeros(8192, dtype=np.uint8)
        assert thief.register_memory(loot.ctypes.data, loot.nbytes) == 0
        rc = thief.transfer_sync_read(
            f"127.0.0.1:{p_engine.get_rpc_port()}", loot.ctypes.data, src.ctypes.data + 8192, 8192
        )
        assert rc != 0 and not loot.any()
    finally:
        client.close()
        server.close()
