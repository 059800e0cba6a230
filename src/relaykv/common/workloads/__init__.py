"""Synthetic workloads, written once for `relaykv bench serve` and `relaykv sim`: pure
functions from parameters and a seed to requests (`random_ids`, `prefix_repetition`,
`shared_prefix`, the record and errors in `sample`), the arrival process (`arrivals`) and
the dataset flags both commands take (`flags`). Same flags and seed, same prompts, whether
sent to a server or simulated. The definitions: docs/benchmarking.md "Datasets".
"""

from __future__ import annotations

from relaykv.common.workloads.arrivals import arrival_offsets
from relaykv.common.workloads.flags import DATASET_NAMES
from relaykv.common.workloads.prefix_repetition import prefix_repetition_requests
from relaykv.common.workloads.random_ids import allowed_ids, random_requests
from relaykv.common.workloads.sample import DatasetError, SampleRequest
from relaykv.common.workloads.shared_prefix import generated_shared_prefix_requests

__all__ = [
    "DATASET_NAMES",
    "DatasetError",
    "SampleRequest",
    "allowed_ids",
    "arrival_offsets",
    "generated_shared_prefix_requests",
    "prefix_repetition_requests",
    "random_requests",
]
