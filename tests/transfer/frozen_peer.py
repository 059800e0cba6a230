"""A prefill engine's transfer port as a SIGSTOPped process looks from outside.

`FrozenPeer` listens on its own port in front of a real transfer server. Connections are
accepted (the kernel does that for a stopped process too) and nothing comes back. `resume()`
is SIGCONT: every held connection and every later one is joined to the real port, bytes
already sent included. `kill()` is SIGKILL: held connections are closed and the port stops
listening. Tests point a grant at `port` (re-signed, since a grant names P's port).
"""

from __future__ import annotations

import contextlib
import socket
import threading


class FrozenPeer:
    def __init__(self, target_port: int, host: str = "127.0.0.1") -> None:
        self.target = (host, target_port)
        self._listener = socket.create_server((host, 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._held: list[socket.socket] = []
        self._open: list[socket.socket] = []
        self._state = "frozen"
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def connections(self) -> int:
        with self._lock:
            return len(self._held) + len(self._open) // 2

    def resume(self) -> None:
        with self._lock:
            self._state = "running"
            held, self._held = self._held, []
        for conn in held:
            self._join(conn)

    def kill(self) -> None:
        with self._lock:
            self._state = "dead"
            conns, self._held = [*self._held, *self._open], []
            self._open = []
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
        self._listener.close()

    close = kill

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # killed
            with self._lock:
                state = self._state
                if state == "frozen":
                    self._held.append(conn)
            if state == "running":
                self._join(conn)
            elif state == "dead":
                conn.close()

    def _join(self, conn: socket.socket) -> None:
        upstream = socket.create_connection(self.target)
        with self._lock:
            self._open += [conn, upstream]
        for src, dst in ((conn, upstream), (upstream, conn)):
            threading.Thread(target=_pump, args=(src, dst), daemon=True).start()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := src.recv(1 << 16):
            dst.sendall(data)
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)
