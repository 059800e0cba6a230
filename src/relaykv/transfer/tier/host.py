"""The native tier: host memory per engine (`--kv-offloading-backend native`, docs/tier.md).

A `[capacity, block_bytes]` host buffer (pinned when the pages live on a GPU, so copies are
true DMA) and one worker thread that runs the jobs in order: a store gathers the job's device
blocks and scatters them into their slots, a load the reverse. The engine's step thread only
queues jobs and collects finished ones (`poll`): no copy runs on the step's critical path.
On a GPU the worker copies on its own CUDA stream, ordered after the work already queued on
the default stream (the step that wrote the blocks). On the CPU engine the "device" pool and
the tier are both host memory; the path is the same.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any

import torch

from relaykv.kvcache.tier import JobKind, TierJob
from relaykv.transfer.tier.base import TierRequest

log = logging.getLogger(__name__)


class HostTier:
    """`TierBackend` over a host buffer, copying on a worker thread."""

    name = "native"
    medium = "CPU"  # vLLM's KV-event medium for host memory

    def __init__(self, kv_buffer: Any, capacity_blocks: int) -> None:
        """`kv_buffer`: the executor's pages, a torch tensor (or a numpy array, shared)."""
        if not isinstance(kv_buffer, torch.Tensor):
            kv_buffer = torch.from_numpy(kv_buffer)
        if kv_buffer.dim() != 2:
            raise ValueError("the KV buffer must be [num_blocks, block_bytes]")
        self.kv = kv_buffer
        self._cuda = kv_buffer.is_cuda
        self.host = torch.empty(
            (capacity_blocks, kv_buffer.shape[1]), dtype=kv_buffer.dtype, pin_memory=self._cuda
        )
        self._jobs: queue.SimpleQueue[TierJob | None] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[tuple[TierJob, bool]] = queue.SimpleQueue()
        self._stream = torch.cuda.Stream(kv_buffer.device) if self._cuda else None
        self._thread = threading.Thread(target=self._run, name="relaykv-kv-tier", daemon=True)
        self._thread.start()
        self.bytes_stored = 0
        self.bytes_loaded = 0

    @property
    def capacity_blocks(self) -> int:
        return int(self.host.shape[0])

    def submit(self, job: TierJob) -> None:
        self._jobs.put(job)

    def poll(self) -> list[tuple[TierJob, bool]]:
        out = []
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                return out

    def shutdown(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=5)

    # -- the worker ---------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                self._copy(job)
                ok = True
            except Exception:  # a failed job is reported, never raised into the engine
                log.exception("KV tier job %d failed", job.job_id)
                ok = False
            self._done.put((job, ok))

    def _copy(self, job: TierJob) -> None:
        slots = torch.tensor([c.slot for c in job.copies], dtype=torch.long)
        blocks = torch.tensor([c.block for c in job.copies], dtype=torch.long)
        nbytes = job.num_blocks * int(self.kv.shape[1]) * self.kv.element_size()
        if self._stream is None:
            if job.kind is JobKind.STORE:
                self.host.index_copy_(0, slots, self.kv.index_select(0, blocks))
                self.bytes_stored += nbytes
            else:
                self.kv.index_copy_(0, blocks, self.host.index_select(0, slots))
                self.bytes_loaded += nbytes
            return
        device = self.kv.device
        with torch.cuda.stream(self._stream):
            self._stream.wait_stream(torch.cuda.default_stream(device))
            dev_blocks = blocks.to(device, non_blocking=True)
            if job.kind is JobKind.STORE:
                staged = self.kv.index_select(0, dev_blocks).to("cpu", non_blocking=True)
                self._stream.synchronize()
                self.host.index_copy_(0, slots, staged)
                self.bytes_stored += nbytes
            else:
                staged = self.host.index_select(0, slots).pin_memory()
                self.kv.index_copy_(0, dev_blocks, staged.to(device, non_blocking=True))
                self._stream.synchronize()
                self.bytes_loaded += nbytes


def host_tier(request: TierRequest) -> HostTier:
    return HostTier(request.kv_buffer, request.capacity_blocks)
