"""A serving endpoint as its own process, driven by JSON lines on stdin.

For cross-process tests, benchmarks and manual two-host trials:

    python -m relaykv.transfer.transport.serving.standalone --kv-transport tcp \\
        --kv-transfer-host 0.0.0.0 --num-blocks 64 --block-bytes 4096 --page-bytes 4096,1024

It fills its buffer from `--seed` (`seeded_buffer`, so a reader can check every byte),
prints `RELAYKV-PEER <descriptor json>`, then answers each command line with
`RELAYKV-OK <json>` or `RELAYKV-ERR <message>`:

    {"op": "allow", "request_id": "r1", "blocks": {"0": [1, 2]}, "lease_s": 30}
    {"op": "release", "request_id": "r1"}
    {"op": "inject", "faults": {"die_after_pages": 3, "exit_process": true}}  (null: none)
    {"op": "events"}   {"op": "stats"}   {"op": "exit"}
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import replace
from typing import Any

import numpy as np

from relaykv.common.plumbing.child_process import ChildProcess
from relaykv.transfer.transport.descriptor import KVSourceDescriptor
from relaykv.transfer.transport.layout import PageLayout
from relaykv.transfer.transport.registry import (
    add_transport_arguments,
    get_transport,
    options_from_args,
)
from relaykv.transfer.transport.serving.faults import FaultPlan

READY = "RELAYKV-PEER "


def seeded_buffer(layout: PageLayout, seed: int) -> np.ndarray:
    """The buffer contents a standalone peer serves for `seed` (block 0 stays zero)."""
    rng = np.random.default_rng(seed)
    buffer = rng.integers(0, 256, (layout.num_blocks, layout.block_bytes), dtype=np.uint8)
    buffer[0] = 0
    return buffer


def _command(server: Any, line: str) -> Any:
    cmd = json.loads(line)
    op = cmd.get("op")
    if op == "allow":
        blocks = {int(g): ids for g, ids in cmd["blocks"].items()}
        server.allow(cmd["request_id"], blocks, time.monotonic() + float(cmd.get("lease_s", 30)))
        return None
    if op == "release":
        return server.release(cmd["request_id"])
    if op == "inject":
        faults = cmd.get("faults")
        server.inject(FaultPlan.from_dict(faults) if faults else None)
        return None
    if op == "events":
        return [
            {"kind": e.kind, "request_id": e.request_id, "nbytes": e.nbytes, "detail": e.detail}
            for e in server.events()
        ]
    if op == "stats":
        return server.stats()
    raise ValueError(f"unknown op {op!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="relaykv-transfer-peer", description=__doc__.split("\n")[0]
    )
    add_transport_arguments(parser)
    parser.add_argument("--num-blocks", type=int, required=True)
    parser.add_argument("--block-bytes", type=int, required=True)
    parser.add_argument("--page-bytes", required=True, help="comma-separated, one per group")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--engine-id", default="peer")
    parser.add_argument("--chunk-bytes", type=int, default=4 << 20)
    args = parser.parse_args(argv)
    try:
        layout = PageLayout(
            args.num_blocks, args.block_bytes, tuple(int(x) for x in args.page_bytes.split(","))
        )
        options = replace(options_from_args(args), chunk_bytes=args.chunk_bytes)
    except ValueError as exc:
        parser.error(str(exc))
    server = get_transport(args.kv_transport).create_server(
        seeded_buffer(layout, args.seed), layout, engine_id=args.engine_id, options=options
    )
    print(READY + server.descriptor.to_json().decode(), flush=True)
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            if json.loads(line).get("op") == "exit":
                break
            try:
                print("RELAYKV-OK " + json.dumps(_command(server, line)), flush=True)
            except Exception as exc:
                print(f"RELAYKV-ERR {type(exc).__name__}: {exc}", flush=True)
    finally:
        server.close()
    return 0


class StandalonePeer:
    """Spawn and drive a standalone serving process (tests, benchmarks)."""

    def __init__(
        self,
        transport: str,
        layout: PageLayout,
        seed: int = 0,
        host: str = "127.0.0.1",
        chunk_bytes: int = 4 << 20,
        start_timeout_s: float = 60.0,
    ) -> None:
        self.layout = layout
        self.seed = seed
        cmd = [
            sys.executable,
            "-m",
            "relaykv.transfer.transport.serving.standalone",
            "--kv-transport",
            transport,
            "--kv-transfer-host",
            host,
            "--num-blocks",
            str(layout.num_blocks),
            "--block-bytes",
            str(layout.block_bytes),
            "--page-bytes",
            ",".join(map(str, layout.page_bytes)),
            "--seed",
            str(seed),
            "--chunk-bytes",
            str(chunk_bytes),
        ]
        # Its stderr stays ours: a peer that fails shows its traceback in the test output.
        self.child = ChildProcess(cmd, pipe=True, stdin=True, own_stderr=True)
        self.child.start()
        deadline = time.monotonic() + start_timeout_s
        self.descriptor: KVSourceDescriptor | None = None
        while self.descriptor is None:
            line = self.child.readline()
            if not line:
                raise RuntimeError(f"standalone peer exited early (rc={self.child.finish(10)})")
            if line.startswith(READY):
                self.descriptor = KVSourceDescriptor.from_json(line[len(READY) :])
            elif time.monotonic() > deadline:
                raise RuntimeError("standalone peer did not start in time")

    @property
    def proc(self) -> subprocess.Popen[str]:
        assert self.child.proc is not None
        return self.child.proc

    def call(self, op: str, **fields: Any) -> Any:
        self.child.write(json.dumps({"op": op, **fields}) + "\n")
        while True:
            line = self.child.readline()
            if not line:
                raise RuntimeError(f"standalone peer died (rc={self.child.poll()})")
            if line.startswith("RELAYKV-OK "):
                return json.loads(line[len("RELAYKV-OK ") :])
            if line.startswith("RELAYKV-ERR "):
                raise RuntimeError(line[len("RELAYKV-ERR ") :].strip())

    def allow(self, request_id: str, blocks: dict[int, list[int]], lease_s: float = 30.0) -> None:
        self.call(
            "allow",
            request_id=request_id,
            blocks={str(g): list(map(int, ids)) for g, ids in blocks.items()},
            lease_s=lease_s,
        )

    def close(self) -> None:
        """Ask it to exit (it closes its server), SIGKILL it after 10 s."""
        self.child.stop(10, ask=lambda: self.child.write('{"op": "exit"}\n'))


if __name__ == "__main__":
    sys.exit(main())
