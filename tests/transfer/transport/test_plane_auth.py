"""The authenticated transfer plane (docs/security.md): messages without the cluster secret
are not read, destinations come only from registrations, reads cannot be replayed, and stale
shared-memory files of dead processes are removed."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import msgspec
import numpy as np
import pytest
import zmq

from relaykv.transfer.transport import (
    PageCopy,
    TransferError,
    TransferRefused,
    TransportOptions,
    get_transport,
)
from relaykv.transfer.transport.planes.shm import SharedKVBuffer, ShmRegistration
from relaykv.transfer.transport.planes.shm_files import SHM_DIR, clean_stale_files
from relaykv.transfer.transport.serving.registrations import ReplayGuard
from relaykv.transfer.transport.wire import control
from relaykv.transfer.transport.wire.auth import MessageAuth, default_secret

from .conftest import LAYOUT, OPTIONS
from .test_failures_and_security import make_pair, raw_reader, read_msg


def test_a_reader_without_the_secret_gets_nothing_and_writes_nothing() -> None:
    server, _, _, _ = make_pair("shm")
    dst = SharedKVBuffer(LAYOUT)  # direct mode: P would write straight into these rows
    outsider = get_transport("shm").create_client(
        dst.array, LAYOUT, engine_id="outsider",
        options=TransportOptions(secret=b"not the cluster secret" * 2, timeout_s=1.0,
                                 connect_timeout_s=1.0),
    )
    try:
        server.allow("r", {0: [1, 2]}, time.monotonic() + 30)
        with pytest.raises(TransferError):
            outsider.read(server.descriptor, "r", [PageCopy(0, 1, 5, 8192)])
        assert not dst.array.any()  # not one byte written
        assert server.stats()["unauthenticated"] >= 2  # its Register and its Read
        assert server.stats()["reads"] == 0 and len(server.readers) == 0
    finally:
        outsider.close()
        server.close()
        dst.close()


def test_destinations_come_from_registrations_only() -> None:
    server, client, _, _ = make_pair("tcp")
    victim = SharedKVBuffer(LAYOUT)
    sock = raw_reader(server)
    codec = control.Codec(MessageAuth(default_secret()))
    try:
        server.allow("r", {0: [1]}, time.monotonic() + 30)
        # a legitimate reader registers nothing for tcp: P refuses a Read that names memory
        sock.send_multipart(codec.to_server(control.Register("m", b"")))
        direct = msgspec.msgpack.encode(ShmRegistration(victim.name, LAYOUT.block_bytes, True))
        sock.send_multipart(codec.to_server(read_msg("t1", "r", [(0, 1, 2, 8192)], "m", direct)))
        assert sock.poll(5000)
        reply = codec.decode_to_client(*sock.recv_multipart())
        assert isinstance(reply, control.Refused) and "unusable destination" in reply.reason
        # the same Read again is a replay
        sock.send_multipart(codec.to_server(read_msg("t1", "r", [(0, 1, 2, 8192)], "m")))
        assert sock.poll(5000)
        reply = codec.decode_to_client(*sock.recv_multipart())
        assert isinstance(reply, control.Refused) and "replayed" in reply.reason
        assert not victim.array.any()
    finally:
        sock.close(0)
        client.close()
        server.close()
        victim.close()


def test_one_destination_belongs_to_one_reader() -> None:
    shm = get_transport("shm")
    src = np.ones((LAYOUT.num_blocks, LAYOUT.block_bytes), dtype=np.uint8)
    server = shm.create_server(src, LAYOUT, engine_id="P", options=OPTIONS)
    d1 = SharedKVBuffer(LAYOUT)
    try:
        registration = msgspec.msgpack.encode(ShmRegistration(d1.name, LAYOUT.block_bytes, True))
        server.readers.register("D1", registration)
        with pytest.raises(ValueError, match="registered by reader 'D1'"):
            server.readers.register("D2", registration)
        with pytest.raises(ValueError, match="already registered with another memory"):
            server.readers.register("D1", msgspec.msgpack.encode(
                ShmRegistration(d1.name, LAYOUT.block_bytes // 2, True)))
    finally:
        server.close()
        d1.close()


def test_replay_guard_window() -> None:
    guard = ReplayGuard(window_s=60)
    assert guard.check("a", 1000.0, now=1000.0) is None
    assert "replayed" in guard.check("a", 1000.0, now=1001.0)
    assert "replay window" in guard.check("b", 900.0, now=1000.0)
    assert guard.check("a", 1070.0, now=1070.0) is None  # forgotten after the window


def test_stale_files_of_dead_creators_are_removed_and_p_unmaps_them() -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead_pid = int(dead.stdout)
    live = SharedKVBuffer(LAYOUT)  # (creating one also cleans: the stale file comes after)
    shm = get_transport("shm")
    server = shm.create_server(np.zeros((LAYOUT.num_blocks, LAYOUT.block_bytes), np.uint8),
                               LAYOUT, engine_id="P", options=OPTIONS)
    stale = os.path.join(SHM_DIR, f"relaykv-{dead_pid}-{'ab' * 16}")
    fd = os.open(stale, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, b"\0" * 8192)
    os.close(fd)
    try:
        server.readers.register("ghost", msgspec.msgpack.encode(ShmRegistration(
            os.path.basename(stale), 8192, True)))
        server.readers.register("live", msgspec.msgpack.encode(ShmRegistration(
            live.name, LAYOUT.block_bytes, True)))
        removed = clean_stale_files()
        assert os.path.basename(stale) in removed and not os.path.exists(stale)
        assert os.path.exists(os.path.join(SHM_DIR, live.name))
        server.readers.prune()  # P drops its mapping of the dead reader's memory
        assert server.readers.get("ghost") is None and server.readers.get("live") is not None
    finally:
        server.close()
        live.close()
        if os.path.exists(stale):
            os.unlink(stale)


def test_a_registered_reader_is_still_bound_by_the_allow_list() -> None:
    server, client, _, _ = make_pair("tcp")
    try:
        with pytest.raises(TransferRefused, match="unknown or was released"):
            client.read(server.descriptor, "nobody-allowed-this", [PageCopy(0, 1, 2, 8192)])
    finally:
        client.close()
        server.close()


_ = zmq  # raw sockets come from raw_reader
