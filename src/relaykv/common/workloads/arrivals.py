"""Request arrival times: all at once, Poisson, or gamma with a burstiness factor.

vLLM's rule (`get_request`): with rate `inf` every request is sent at t=0; otherwise the
gaps are gamma(shape=burstiness, scale=1/(rate*burstiness)) - exponential, i.e. a Poisson
process, when burstiness is 1 - and `burstiness=inf` gives constant gaps of 1/rate. The
cumulative times are then rescaled so the last request is sent at exactly N/rate, which
keeps throughput comparable across seeds.
"""

from __future__ import annotations

import math
from typing import cast

import numpy as np

from relaykv.common.workloads.sample import DatasetError


def arrival_offsets(
    num_requests: int, request_rate: float, burstiness: float = 1.0, seed: int = 0
) -> list[float]:
    """Seconds after the start at which each request is sent (non-decreasing)."""
    if num_requests <= 0:
        return []
    if not request_rate > 0:
        raise DatasetError(f"--request-rate must be > 0, got {request_rate}")
    if not burstiness > 0:
        raise DatasetError(f"--burstiness must be > 0, got {burstiness}")
    if math.isinf(request_rate):
        return [0.0] * num_requests
    if math.isinf(burstiness):
        gaps = np.full(num_requests, 1.0 / request_rate)
    else:
        rng = np.random.default_rng(seed)
        theta = 1.0 / (request_rate * burstiness)
        gaps = rng.gamma(shape=burstiness, scale=theta, size=num_requests)
    times = np.cumsum(gaps)
    if times[-1] > 0:
        times *= (num_requests / request_rate) / times[-1]
    return cast(list[float], times.tolist())


def distribution_name(burstiness: float) -> str:
    return "Poisson process" if burstiness == 1.0 else "Gamma distribution"
