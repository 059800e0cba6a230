"""CPU threads of engine processes: `relaykv serve --torch-threads N`, and the OpenMP wait
policy `relaykv up` gives the engines it co-locates (docs/serving.md, "CPU threads").

torch runs its matrix products on a pool of OpenMP threads, one per CPU by default, and
OpenMP's default lets a worker spin for a while after each parallel region instead of
sleeping. Alone on a host that is harmless. Two engines on the same cores (a P/D pair under
`relaykv up`) then burn each other's CPU spinning: measured on this 2-core machine, two
busy processes with 2 threads each made half the progress of two with 1 thread each, and
with `OMP_WAIT_POLICY=PASSIVE` (workers sleep when idle) they made 92 % of it, while an
engine running alone keeps both cores (1.5x the speed of 1 thread).

Contract:
* `apply_torch_threads(n)`: n >= 1 sets torch's intra-op thread count for the whole process
  (every thread that later runs torch ops, the engine loop included); None leaves torch's
  default (which honours `OMP_NUM_THREADS`).
* `colocated_engine_env(environ)`: the environment variables to add for engines that share
  a host: `OMP_WAIT_POLICY=PASSIVE`, unless `environ` already chooses a policy.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

OMP_ENV = "OMP_NUM_THREADS"
WAIT_POLICY_ENV = "OMP_WAIT_POLICY"


def positive_threads(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def colocated_engine_env(environ: Mapping[str, str]) -> dict[str, str]:
    return {} if environ.get(WAIT_POLICY_ENV) else {WAIT_POLICY_ENV: "PASSIVE"}


def apply_torch_threads(threads: int | None) -> None:
    if threads is None:
        return
    import torch

    torch.set_num_threads(threads)
