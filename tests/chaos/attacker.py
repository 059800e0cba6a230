"""A hostile local user, for the chaos suite: a forked child that drops to `nobody` and then
tries what issue #10 found possible (docs/security.md, "Threat model").

It is forked (not exec'd) so it keeps this interpreter and its imported modules: the
project's interpreter lives under a directory `nobody` cannot enter.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from typing import Any

import msgspec
import zmq

NOBODY = 65534


def _attack(report: Any, targets: dict[str, Any]) -> None:
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)
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


def attack_as_nobody(targets: dict[str, Any], timeout: float = 30.0) -> dict[str, Any]:
    """Run the attack in a child running as `nobody`; its report."""
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_attack, args=(child, targets))
    proc.start()
    try:
        if not parent.poll(timeout):
            raise AssertionError("the attacker child did not report")
        return parent.recv()
    finally:
        proc.join(5)
        if proc.is_alive():
            proc.kill()
