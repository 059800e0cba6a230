"""A local Mooncake Store master (`relaykv up --kv-offloading-backend mooncake`, tests).

`mooncake_master` ships with the `mooncake` package (a console script next to the Python that
imports it). It is started with its RPC port and its HTTP admin port (metrics, and a key
listing) bound to loopback, no metadata server (clients use the P2P handshake), and a short
client TTL so a killed engine's segment is dropped within seconds
(docs/tier.md "Mooncake Store", docs/security.md "The KV store").
"""

from __future__ import annotations

import shutil
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from relaykv.common.plumbing.child_process import ChildProcess, free_port

CLIENT_TTL_S = 5  # seconds a silent client (a killed engine) keeps its segment


def master_binary() -> str:
    """The `mooncake_master` executable (raises FileNotFoundError naming the package)."""
    beside = Path(sys.executable).with_name("mooncake_master")
    if beside.exists():
        return str(beside)
    found = shutil.which("mooncake_master")
    if found is None:
        raise FileNotFoundError(
            "mooncake_master not found (pip install mooncake-transfer-engine-non-cuda)"
        )
    return found


@dataclass(frozen=True, slots=True)
class MasterPorts:
    host: str
    rpc: int  # what engines get as --kv-store-master
    admin: int  # HTTP metrics and admin (loopback only)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.rpc}"

    @classmethod
    def free(cls, host: str = "127.0.0.1") -> MasterPorts:
        return cls(host, free_port(host), free_port("127.0.0.1"))


def master_argv(ports: MasterPorts, client_ttl_s: int = CLIENT_TTL_S) -> list[str]:
    return [
        master_binary(),
        f"-rpc_port={ports.rpc}",
        f"-rpc_address={ports.host}",
        f"-metrics_port={ports.admin}",
        "-metrics_host=127.0.0.1",
        "-enable_http_metadata_server=false",
        f"-client_ttl={client_ttl_s}",
    ]


def wait_listening(host: str, port: int, timeout_s: float, child: ChildProcess) -> None:
    """Return once `host:port` accepts connections (raises if the child exits or time ends)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise RuntimeError(f"mooncake_master exited:\n{child.log_tail()}")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"mooncake_master did not listen on {host}:{port} in {timeout_s} s")


def start_master(ports: MasterPorts, log_path: Path, timeout_s: float = 30.0) -> ChildProcess:
    """Start a master on `ports`, logging to `log_path`; returns once it listens."""
    child = ChildProcess(master_argv(ports), log_path=log_path, die_with_parent=True)
    child.start()
    try:
        wait_listening(ports.host, ports.rpc, timeout_s, child)
    except Exception:
        child.stop(5)
        raise
    return child
