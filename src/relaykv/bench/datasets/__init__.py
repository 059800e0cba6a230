"""Synthetic datasets: pure functions from parameters and a seed to requests.

The definitions: docs/benchmarking.md "Datasets".
"""

from __future__ import annotations

from relaykv.bench.datasets.prefix_repetition import prefix_repetition_requests
from relaykv.bench.datasets.random_ids import allowed_ids, random_requests
from relaykv.bench.datasets.sample import DatasetError, SampleRequest
from relaykv.bench.datasets.shared_prefix import generated_shared_prefix_requests

DATASET_NAMES: tuple[str, ...] = ("random", "prefix_repetition", "generated-shared-prefix")

__all__ = [
    "DATASET_NAMES",
    "DatasetError",
    "SampleRequest",
    "allowed_ids",
    "generated_shared_prefix_requests",
    "prefix_repetition_requests",
    "random_requests",
]
