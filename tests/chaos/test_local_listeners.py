"""Another local user against every listener of a default `relaykv up` (issue #23): KV
events and their replay are `ipc://` sockets in `up`'s private runtime directory, the
transfer port answers only messages tagged with the cluster secret, and the HTTP ports hold
no prompt token and no secret. The user `nobody`, connecting to every listening port and
unix socket of the cluster while its own users send prompts, gets no prompt token, no KV
byte and no secret, and the users' outputs are unchanged (docs/security.md, "Listeners")."""

from __future__ import annotations

import asyncio
import os
import random
import stat
import threading
from pathlib import Path

import httpx
import pytest

from .attacker import probe_listeners_as_nobody
from .harness import UpCluster, descendants, listeners, run_load

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop a child to uid nobody"),
]

# Default `relaykv up` (cache-aware routing, so KV events on; shm transport; no API key),
# with a small pool.
UP_ARGS = ["--num-blocks", "400", "--max-model-len", "1024"]
WINDOW = 8  # a run of this many prompt tokens in a reply counts as a leaked prompt


def _prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, 256) for _ in range(80)] for _ in range(n)]


PROMPTS = _prompts(6, 23)


def _outputs(up: UpCluster) -> list[list[int]]:
    outcomes = asyncio.run(run_load(up.router, PROMPTS, 3))
    assert all(o.status == 200 for o in outcomes), [o.error for o in outcomes]
    return [o.token_ids for o in outcomes]


def _leaked_windows(text: str) -> list[list[int]]:
    found = []
    for prompt in PROMPTS:
        for i in range(0, len(prompt) - WINDOW + 1, 4):
            window = prompt[i : i + WINDOW]
            if any(sep.join(map(str, window)) in text for sep in (", ", ",")):
                found.append(window)
    return found


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> UpCluster:
    cluster = UpCluster(UP_ARGS, tmp_path_factory.mktemp("listeners-up")).start()
    yield cluster
    if cluster.proc is not None and cluster.proc.poll() is None:
        cluster.stop()


def test_another_user_gets_nothing_from_any_listener(up: UpCluster) -> None:
    expected = _outputs(up)
    decode_pid = up.pids()[up.info["decode"][0]]
    environ = Path(f"/proc/{decode_pid}/environ").read_bytes().split(b"\0")
    secret_file = next(e.split(b"=", 1)[1].decode() for e in environ
                       if e.startswith(b"RELAYKV_KV_SECRET_FILE="))
    secret = Path(secret_file).read_text().strip()
    assert up.proc is not None
    ports, unix_paths = listeners([up.proc.pid, *descendants(up.proc.pid)])
    member_ports = {int(url.rsplit(":", 1)[1]) for url in (up.router, *up.engines())}
    assert member_ports <= set(ports)
    assert len(ports) > len(member_ports), "the prefill engine's transfer port listens too"
    events = [p for p in unix_paths if p.endswith(("-events", "-replay"))]
    assert len(events) == 4, unix_paths  # events + replay, per engine, as ipc sockets
    for path in events:
        run_dir = os.stat(os.path.dirname(path))
        assert stat.S_IMODE(run_dir.st_mode) == 0o700 and run_dir.st_uid == os.geteuid()

    stop = threading.Event()

    def users() -> None:  # the cluster's own users keep sending prompts during the probe
        while not stop.is_set():
            asyncio.run(run_load(up.router, PROMPTS, 2, max_tokens=2))

    load = threading.Thread(target=users)
    load.start()
    try:
        report = probe_listeners_as_nobody({"ports": ports, "unix_paths": unix_paths})
    finally:
        stop.set()
        load.join(120)
    assert report["uid"] == 65534
    assert report["zmq_bytes"] == {port: 0 for port in ports}, report["zmq_bytes"]
    assert all(r.startswith("denied") for r in report["unix"].values()), report["unix"]
    answered = {k: body for k, (status, body) in report["http"].items() if status == 200}
    assert any(k.endswith("/routing?recent=1") for k in answered)  # no key set: open, but
    for where, body in answered.items():  # no reply holds a prompt or the secret
        assert secret not in body, where
        assert _leaked_windows(body) == [], where
    # The router did follow the events the probe could not read.
    routing = httpx.get(f"{up.router}/routing", timeout=10).json()
    assert all(e["indexed_blocks"] for e in routing["engines"].values()), routing
    assert _outputs(up) == expected
