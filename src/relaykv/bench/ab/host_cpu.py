"""The host's CPU during a measured group, from `/proc/stat` (Linux; None elsewhere).

On a virtual machine the hypervisor may run other guests on this guest's CPUs: that time is
*steal*. A latency-bound group (c1: one request at a time, a handful of processes waking
each other over HTTP and shared memory) pays it at every wake-up, so the same configuration
runs slower whenever the host is busier; docs/benchmarking.md "Round 3 runs" measured c1
TTFT moving by 38% across five clusters of one configuration. `bench ab` records, per group,
the share of the CPUs' time that was stolen and the share that was busy (user, nice, system,
irq, softirq), so a slot that ran on a disturbed host shows in the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

STAT = Path("/proc/stat")


@dataclass(frozen=True, slots=True)
class CpuTimes:
    """Cumulative jiffies over every CPU."""

    total: int
    busy: int
    steal: int


def read_cpu_times(path: Path = STAT) -> CpuTimes | None:
    """The `cpu` line of `/proc/stat` (None when it cannot be read or parsed)."""
    try:
        with path.open() as f:
            head = f.readline().split()
    except OSError:
        return None
    if not head or head[0] != "cpu":
        return None
    try:
        v = [int(x) for x in head[1:]]
    except ValueError:
        return None
    v += [0] * (8 - len(v))  # steal is field 8 (Linux >= 2.6.11)
    user, nice, system, _idle, _iowait, irq, softirq, steal = v[:8]
    # guest and guest_nice (fields 9-10) are already counted in user and nice.
    return CpuTimes(sum(v[:8]), user + nice + system + irq + softirq, steal)


def cpu_shares(before: CpuTimes | None, after: CpuTimes | None) -> dict[str, float] | None:
    """Percent of the CPUs' time between the two readings that was stolen / busy."""
    if before is None or after is None:
        return None
    total = after.total - before.total
    if total <= 0:
        return None
    return {
        "steal_pct": 100.0 * (after.steal - before.steal) / total,
        "busy_pct": 100.0 * (after.busy - before.busy) / total,
    }


def summed_interval(readings: list[CpuTimes]) -> tuple[CpuTimes, CpuTimes]:
    """Readings taken in (before, after) pairs -> one (before, after) pair spanning the sum
    of those intervals only (`cpu_shares` of it: the shares over those intervals)."""
    total = busy = steal = 0
    for before, after in zip(readings[::2], readings[1::2], strict=True):
        total += after.total - before.total
        busy += after.busy - before.busy
        steal += after.steal - before.steal
    return CpuTimes(0, 0, 0), CpuTimes(total, busy, steal)
