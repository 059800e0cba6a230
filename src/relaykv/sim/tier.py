"""The simulated KV tier: the real `KVTier` over a modelled host link (docs/simulator.md
"KV tier").

`SimTier` is a `TierBackend` on the simulator's clock. It holds `capacity_blocks` blocks
(`--kv-offloading-size` // block_bytes); no bytes move. Each direction (stores, device to
host; loads, host to device) is one serial link of `bandwidth` bytes/s, as the PCIe lanes of
a GPU are: a job waits for the jobs queued before it in its direction, then takes
`blocks * block_bytes / bandwidth`. When a job ends the engine is kicked, so a request whose
load ended is scheduled at once, as the real engine's next step does.
"""

from __future__ import annotations

from collections.abc import Callable

from relaykv.kvcache.tier import JobKind, TierJob
from relaykv.sim.clock import EventLoop

# A PCIe Gen5 x16 link's sustained host<->device rate (about half its 64 GB/s peak).
DEFAULT_TIER_BANDWIDTH = 32e9


class SimTier:
    name = "sim"
    medium = "CPU"

    def __init__(
        self,
        loop: EventLoop,
        capacity_blocks: int,
        block_bytes: int,
        bandwidth: float = DEFAULT_TIER_BANDWIDTH,
        on_done: Callable[[], None] = lambda: None,
    ) -> None:
        if bandwidth <= 0:
            raise ValueError(f"the tier's bandwidth must be > 0, got {bandwidth}")
        self.loop = loop
        self.capacity_blocks = capacity_blocks
        self.block_bytes = block_bytes
        self.bandwidth = bandwidth
        self.on_done = on_done
        self._free_at = {JobKind.STORE: 0.0, JobKind.LOAD: 0.0}
        self._done: list[tuple[TierJob, bool]] = []
        self.bytes_moved = {JobKind.STORE: 0, JobKind.LOAD: 0}

    def submit(self, job: TierJob) -> None:
        nbytes = job.num_blocks * self.block_bytes
        start = max(self.loop.now, self._free_at[job.kind])
        end = start + nbytes / self.bandwidth
        self._free_at[job.kind] = end
        self.bytes_moved[job.kind] += nbytes
        self.loop.after(end - self.loop.now, lambda: self._finish(job))

    def _finish(self, job: TierJob) -> None:
        self._done.append((job, True))
        self.on_done()

    def poll(self) -> list[tuple[TierJob, bool]]:
        done, self._done = self._done, []
        return done

    def shutdown(self) -> None:
        self._done.clear()
