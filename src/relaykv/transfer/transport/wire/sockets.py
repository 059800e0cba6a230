"""The ZeroMQ sockets of the transfer plane, set up one way everywhere."""

from __future__ import annotations

import zmq

# A control message is small (a Read of 100k pages is ~2 MB); P never buffers more than
# this from anyone, authenticated or not.
MAX_CONTROL_MESSAGE = 16 << 20


def bind_router(ctx: zmq.Context, host: str, port: int) -> tuple[zmq.Socket, int]:
    """P's ROUTER on `host:port` (0: a free port); returns the socket and its port."""
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)  # credits bound what is queued
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a vanished reader raises, not hangs
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_CONTROL_MESSAGE)
    bind_host = f"[{host}]" if ":" in host else host
    if ":" in host:
        sock.setsockopt(zmq.IPV6, 1)
    if port:
        sock.bind(f"tcp://{bind_host}:{port}")
    else:
        port = sock.bind_to_random_port(f"tcp://{bind_host}")
    return sock, int(port)


def connect_dealer(ctx: zmq.Context, endpoint: str, ipv6: bool) -> tuple[zmq.Socket, zmq.Socket]:
    """D's DEALER to one serving endpoint, and its monitor (connected, disconnected, and
    connection refused: a retry scheduled)."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.RECONNECT_IVL, 100)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_CONTROL_MESSAGE + (256 << 20))  # tcp page frames
    if ipv6:
        sock.setsockopt(zmq.IPV6, 1)
    monitor = sock.get_monitor_socket(
        zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED
    )
    sock.connect(endpoint)
    return sock, monitor
