"""The native tier: host memory per engine (`--kv-offloading-backend native`, docs/tier.md).

A `[capacity, block_bytes]` host buffer (pinned when the pages live on a GPU, so copies are
true DMA; touched once by the worker at start otherwise) and one worker thread that runs the
jobs in order: a store gathers the job's device blocks and scatters them into their slots, a
load the reverse. The engine's step thread only
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

import numpy as np
import torch

from relaykv.kvcache.tier import JobKind, TierJob
from relaykv.transfer.tier.base import TierRequest, drain

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
        if not self._cuda:
            self._kv_np = kv_buffer.numpy()  # the same memory
            self._host_np = self.host.numpy()
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
        return drain(self._done)

    def shutdown(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=5)

    # -- the worker ---------------------------------------------------------------------
    def _run(self) -> None:
        if not self._cuda:
            # Touch every page of the host buffer once, here and not in the first stores (a
            # page fault per 4 KiB costs more than the copy); pinned memory is resident.
            self.host.zero_()
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
        nbytes = job.num_blocks * int(self.kv.shape[1]) * self.kv.element_size()
        store = job.kind is JobKind.STORE
        if self._stream is None:
            # numpy's gather and scatter run on this thread alone, without the GIL (torch's
            # indexed copies would spread over the intra-op threads the step computes on).
            blocks = np.fromiter((c.block for c in job.copies), np.int64, job.num_blocks)
            slots = np.fromiter((c.slot for c in job.copies), np.int64, job.num_blocks)
            if store:
                self._host_np[slots] = self._kv_np[blocks]
            else:
                self._kv_np[blocks] = self._host_np[slots]
        else:
            self._copy_cuda(job, store)
        if store:
            self.bytes_stored += nbytes
        else:
            self.bytes_loaded += nbytes

    def _copy_cuda(self, job: TierJob, store: bool) -> None:
        assert self._stream is not None
        device = self.kv.device
        with torch.cuda.stream(self._stream):
            self._stream.wait_stream(torch.cuda.default_stream(device))
            for block, slot, count in _runs(job):
                dev, hst = self.kv[block : block + count], self.host[slot : slot + count]
                if store:
                    hst.copy_(dev, non_blocking=True)  # pinned host: a true async DMA
                else:
                    dev.copy_(hst, non_blocking=True)
            self._stream.synchronize()


def _runs(job: TierJob) -> list[tuple[int, int, int]]:
    """The job's copies as `(first block, first slot, count)` runs of consecutive pairs."""
    pairs = sorted((c.block, c.slot) for c in job.copies)
    runs: list[tuple[int, int, int]] = []
    for block, slot in pairs:
        if runs:
            b0, s0, n = runs[-1]
            if block == b0 + n and slot == s0 + n:
                runs[-1] = (b0, s0, n + 1)
                continue
        runs.append((block, slot, 1))
    return runs


def host_tier(request: TierRequest) -> HostTier:
    return HostTier(request.kv_buffer, request.capacity_blocks)
