"""How many CPU threads one engine process gives torch (`relaykv serve --torch-threads N`).

torch's default is one intra-op (OpenMP) thread per CPU of the machine. That suits one engine
alone on a host; engines that share a host (`relaykv up` starts a prefill and a decode engine
side by side) then each spin that many threads on the same cores, and OpenMP's busy-waiting
workers preempt each other: on 2 cores a P/D pair with default threads ran 3-10x slower with
far larger run-to-run variance than with one thread each (docs/serving.md, "CPU threads").
vLLM's CPU backend binds a set of OpenMP threads per worker for the same reason.

Contract:
* `apply_torch_threads(n)`: n >= 1 sets torch's intra-op thread count for the whole process
  (every thread that later runs torch ops, the engine loop included); None leaves torch's
  default (which honours `OMP_NUM_THREADS`).
* `threads_per_engine(engines)`: the CPUs this process may run on, split evenly among
  `engines` co-located engines, at least 1 each (what `relaykv up` gives each member).
"""

from __future__ import annotations

import argparse
import os

OMP_ENV = "OMP_NUM_THREADS"


def positive_threads(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def threads_per_engine(engines: int) -> int:
    return max(1, available_cpus() // max(1, engines))


def apply_torch_threads(threads: int | None) -> None:
    if threads is None:
        return
    import torch

    torch.set_num_threads(threads)
