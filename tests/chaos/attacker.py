"""A hostile local user, for the chaos suite: a forked child that drops to `nobody` and then
tries what issue #10 found possible (docs/security.md, "Threat model").

It is forked (not exec'd) so it keeps this interpreter and its imported modules: the
project's interpreter lives under a directory `nobody` cannot enter.
"""

from __future__ import annotations

import encodings.idna  # noqa: F401  (http.client's lookup, imported before dropping to nobody)
import http.client
import multiprocessing
import os
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec
import zmq

from relaykv.common.messages.kv_events import seq_frame

NOBODY = 65534


def _drop_to_nobody() -> None:
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def _attack(report: Any, targets: dict[str, Any]) -> None:
    _drop_to_nobody()
    out: dict[str, Any] = {"uid": os.getuid(), "shm_writes": [], "secret_read": None,
                           "cmdline_leaks": [], "transfer_replies": 0}
    for path in targets["shm_files"]:
        try:
            with open(path, "r+b") as handle:
                handle.write(b"\xff" * 4096)
            out["shm_writes"].append(f"WROTE {path}")
        except OSError as exc:
            out["shm_writes"].append(f"denied {path}: {exc.strerror}")
    try:
        with open(targets["secret_file"], "rb") as handle:
            out["secret_read"] = handle.read()[:8].hex()
    except OSError as exc:
        out["secret_read"] = f"denied: {exc.strerror}"
    for pid in targets["pids"]:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                argv = handle.read()
        except OSError:
            continue
        for needle in targets["needles"]:
            if needle.encode() in argv:
                out["cmdline_leaks"].append(pid)
    # The transfer port, with a leaked grant: register the victim's KV file as our
    # destination and ask for the grant's pages, signed with a key we made up.
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(targets["endpoint"])
    time.sleep(0.3)
    enc = msgspec.msgpack.Encoder()
    register = enc.encode({"type": "register", "reader": "attacker",
                           "registration": targets["registration"]})
    read = enc.encode({"type": "read", "transfer_id": "t-attack",
                       "request_id": targets["request_id"], "pages": targets["pages"],
                       "sink": b"", "window": 4, "timeout_s": 5.0, "reader": "attacker",
                       "issued_at": time.time()})
    for payload in (register, read):
        sock.send_multipart([os.urandom(32), payload])
    sock.send_multipart([b"garbage"])  # and frames that are not a message at all
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        if sock.poll(200):
            sock.recv_multipart()
            out["transfer_replies"] += 1
    sock.close(0)
    ctx.term()
    report.send(out)


HTTP_PATHS = ("/routing?recent=1", "/cluster", "/metrics", "/health", "/v1/models",
              "/v1/kv_cache_info", "/v1/kv_cache_info/tokenizer")


def _zmq_listen(ctx: zmq.Context, ports: list[int], listen_s: float) -> dict[int, int]:
    """Bytes each port gives a SUB (subscribed to everything), a replay request from batch 0
    (vLLM's replay wire) and a DEALER that just waits, every port at once, over `listen_s`."""
    port_of: dict[zmq.Socket, int] = {}
    poller = zmq.Poller()
    for port in ports:
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        replay = ctx.socket(zmq.DEALER)
        for sock in (sub, replay):
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(f"tcp://127.0.0.1:{port}")
            poller.register(sock, zmq.POLLIN)
            port_of[sock] = port
        replay.send_multipart((b"", seq_frame(0)))  # queued until the connection is up
    received = dict.fromkeys(ports, 0)
    deadline = time.monotonic() + listen_s
    while (left := deadline - time.monotonic()) > 0:
        for sock, _ in poller.poll(max(1, int(left * 1000))):
            received[port_of[sock]] += sum(len(f) for f in sock.recv_multipart())
    for sock in port_of:
        sock.close(0)
    return received


def _probe(report: Any, targets: dict[str, Any]) -> None:
    """Every listener of the cluster as another uid would try it: HTTP GETs (no API key)
    on each TCP port, the ZeroMQ SUB/replay wire on each, and a connect to each unix socket.
    The ports are tried at once (a GET on a port that does not speak HTTP waits out its
    timeout), each for as long as when they were tried one after the other."""
    _drop_to_nobody()
    out: dict[str, Any] = {"uid": os.getuid(), "http": {}, "zmq_bytes": {}, "unix": {}}
    gets = [(port, path) for port in targets["ports"] for path in HTTP_PATHS]
    with ThreadPoolExecutor(max_workers=len(gets) or 1) as pool:
        for (port, path), answer in zip(gets, pool.map(_http_get, gets), strict=True):
            out["http"][f"{port}{path}"] = answer
    ctx = zmq.Context()
    out["zmq_bytes"] = _zmq_listen(ctx, targets["ports"], targets.get("listen_s", 1.5))
    ctx.term()
    for path in targets["unix_paths"]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            try:
                sock.connect(path)
                out["unix"][path] = "CONNECTED"
            except OSError as exc:
                out["unix"][path] = f"denied: {exc.strerror}"
    report.send(out)


def _http_get(target: tuple[int, str]) -> tuple[int, str]:
    """(status, body) of a GET of `path` on `port`, or (-1, the error's name)."""
    port, path = target
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3.0)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read(4_000_000).decode(errors="replace")
    except (OSError, http.client.HTTPException) as exc:
        return -1, type(exc).__name__
    finally:
        conn.close()


def attack_as_nobody(targets: dict[str, Any], timeout: float = 30.0) -> dict[str, Any]:
    """Run the attack in a child running as `nobody`; its report."""
    return _as_nobody(_attack, targets, timeout)


def probe_listeners_as_nobody(targets: dict[str, Any], timeout: float = 120.0) -> dict[str, Any]:
    """Try every listener in `targets` (`ports`, `unix_paths`) as `nobody`; the report."""
    return _as_nobody(_probe, targets, timeout)


def _as_nobody(
    attack: Callable[[Any, dict[str, Any]], None], targets: dict[str, Any], timeout: float
) -> dict[str, Any]:
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=attack, args=(child, targets))
    proc.start()
    try:
        if not parent.poll(timeout):
            raise AssertionError("the attacker child did not report")
        return parent.recv()
    finally:
        proc.join(5)
        if proc.is_alive():
            proc.kill()
