"""Accelerator and link presets with their published figures, and calibration files.

A `HardwareSpec` is what the cost model (`relaykv.sim.cost_model`) needs of one device:
peak dense BF16 tensor FLOP/s, HBM bandwidth, memory, the NVLink bandwidth an all-reduce
runs over, the efficiencies actually reached (MFU for compute-bound prefill, MBU for
memory-bound decode) and the fixed per-step and per-sequence overheads of a serving engine.

Published figures (vendor datasheets, dense = without structured sparsity):
* H20: 148 TFLOP/s BF16, 4.0 TB/s HBM3, 96 GB, NVLink 900 GB/s;
* H100 SXM: 989 TFLOP/s BF16, 3.35 TB/s HBM3, 80 GB, NVLink 900 GB/s;
* H200 SXM: 989 TFLOP/s BF16, 4.8 TB/s HBM3e, 141 GB, NVLink 900 GB/s;
* B200 (HGX): 2,250 TFLOP/s BF16, 8 TB/s HBM3e, 180 GB, NVLink 1,800 GB/s.
Efficiencies (MFU 0.6, MBU 0.7, 2.5 ms per step, 40 us per all-reduce) are typical of
vLLM on Hopper with CUDA graphs; `relaykv sim calibrate` replaces all of them with fitted
values for a measured machine (docs/simulator.md "Cost model" and "Calibration").

Links (`--link`): `rdma` a Mooncake-class RDMA path (one 400 Gb/s NIC per engine, ~85 % of
line rate, 1 ms per transfer for its handshake and completion), `tcp-25g` / `tcp-100g`
(kernel TCP at ~80 % of line rate, 2 ms per transfer), `shm` (same host, a memcpy at
~10 GB/s, 0.1 ms); or a number, the link's Gb/s with the tcp latency.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

GB = 1e9


@dataclass(frozen=True, slots=True)
class HardwareSpec:
    """One device of an engine (an engine with TP t uses t of them).

    `combine`: `max` (roofline: a step takes the longer of its compute and memory time,
    the GPU presets) or `sum` (compute + memory time, what a CPU fit measures).
    """

    name: str
    peak_flops: float
    hbm_bandwidth: float
    memory_bytes: float
    interconnect_bandwidth: float = 450 * GB
    mfu: float = 0.6
    mbu: float = 0.7
    step_overhead_s: float = 2.5e-3
    per_sequence_overhead_s: float = 0.0
    per_token_overhead_s: float = 0.0  # serving bookkeeping per computed token (calibrated)
    allreduce_latency_s: float = 40e-6
    draft_pass_overhead_s: float = 0.3e-3
    kv_bandwidth: float = 0.0  # bytes/s for KV reads and writes (0: hbm_bandwidth)
    request_overhead_s: float = 1e-3  # one HTTP hop through the router to an engine
    # A step's time while another engine's step runs on the same machine, over its time
    # alone (a CPU calibration, where one host runs the whole cluster: measured, >= 1; 1 on
    # accelerators, whose engines do not share devices). relaykv.sim.shared_host applies it.
    shared_host_slowdown: float = 1.0
    combine: str = "max"
    # Engine defaults on this hardware: KV pool bytes per engine (0: memory * TP * 0.9 minus
    # the weights) and the scheduler's token budget per step.
    kv_cache_memory: float = 0.0
    max_num_batched_tokens: int = 8192

    def __post_init__(self) -> None:
        for f in ("peak_flops", "hbm_bandwidth", "memory_bytes", "mfu", "mbu"):
            if not getattr(self, f) > 0:
                raise ValueError(f"hardware {self.name}: {f} must be > 0")
        if not self.shared_host_slowdown >= 1.0:
            raise ValueError(f"hardware {self.name}: shared_host_slowdown must be >= 1")
        if self.combine not in ("max", "sum"):
            raise ValueError(f"hardware {self.name}: combine must be max or sum")

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


HARDWARE: dict[str, HardwareSpec] = {
    "h20": HardwareSpec("h20", 148e12, 4.0e12, 96 * GB, 450 * GB),
    "h100": HardwareSpec("h100", 989e12, 3.35e12, 80 * GB, 450 * GB),
    "h200": HardwareSpec("h200", 989e12, 4.8e12, 141 * GB, 450 * GB),
    "b200": HardwareSpec("b200", 2250e12, 8.0e12, 180 * GB, 900 * GB),
}


def hardware_spec(name: str) -> HardwareSpec:
    """A preset name or a calibration file written by `relaykv sim calibrate`."""
    if name in HARDWARE:
        return HARDWARE[name]
    path = Path(name)
    if not path.is_file():
        raise ValueError(
            f"unknown hardware {name!r}: a preset ({', '.join(HARDWARE)}) or a calibration file"
        )
    raw = json.loads(path.read_text())
    known = {f.name for f in fields(HardwareSpec)}
    return HardwareSpec(**{k: v for k, v in raw.items() if k in known})


def calibrated_acceptance(name: str) -> float | None:
    """The draft acceptance rate a calibration file measured (None for presets)."""
    path = Path(name)
    if name in HARDWARE or not path.is_file():
        return None
    value = json.loads(path.read_text()).get("acceptance_rate")
    return None if value is None else float(value)


@dataclass(frozen=True, slots=True)
class CalibrationConditions:
    """What a calibration file was measured under (docs/simulator.md, "Validation
    conditions"): the model, the draft tokens per step `k`, the draft (`shipped`: the
    model's own, `random`; None without one), the torch threads per engine, the transport."""

    model: str
    speculative_tokens: int
    draft: str | None
    torch_threads: int
    kv_transport: str

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def is_calibration(name: str) -> bool:
    """Whether `--hardware NAME` names a calibration file (not a preset)."""
    return name not in HARDWARE and Path(name).is_file()


def check_conditions(
    name: str, model: str, k: int, draft: str, torch_threads: int
) -> tuple[str, str] | None:
    """(flag, reason) when calibration file `name` was measured under other conditions than
    the simulation asks for; None when they match or `name` is a preset. A simulation of
    other conditions than the measured ones is off without a word (a k=0 calibration has
    no draft pass and no acceptance to simulate k=2 with), so it is refused."""
    if not is_calibration(name):
        return None
    raw = json.loads(Path(name).read_text()).get("conditions")
    if not isinstance(raw, dict):
        return "--hardware", (
            f"the calibration {name} records no conditions (k, draft, torch threads): "
            "made by an older relaykv; run `relaykv sim calibrate` again"
        )
    got = CalibrationConditions(**raw)
    again = "or run `relaykv sim calibrate` again with the simulation's flags"
    want_draft = draft if k else None
    if got.model != model:
        return "--model", f"the calibration {name} timed {got.model}, not {model}"
    if got.speculative_tokens != k:
        return "--speculative-tokens", (
            f"the calibration {name} timed k={got.speculative_tokens}, asked to simulate "
            f"k={k}: pass --speculative-tokens {got.speculative_tokens} {again}"
        )
    if got.draft != want_draft:
        return "--draft-model", (
            f"the calibration {name} timed the {got.draft} draft, asked to simulate the "
            f"{want_draft} one: pass --draft-model {got.draft} {again}"
        )
    if got.torch_threads != torch_threads:
        return "--torch-threads", (
            f"the calibration {name} timed {got.torch_threads} torch thread(s) per engine, "
            f"asked to simulate {torch_threads}: pass --torch-threads {got.torch_threads} "
            f"{again}"
        )
    return None


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """A P->D path: bytes per second per engine NIC and fixed seconds per transfer."""

    name: str
    bandwidth: float
    latency_s: float

    def __post_init__(self) -> None:
        if not self.bandwidth > 0 or self.latency_s < 0:
            raise ValueError(f"link {self.name}: bandwidth must be > 0 and latency >= 0")


LINKS: dict[str, LinkSpec] = {
    "rdma": LinkSpec("rdma", 400e9 / 8 * 0.85, 1e-3),
    "tcp-25g": LinkSpec("tcp-25g", 25e9 / 8 * 0.8, 2e-3),
    "tcp-100g": LinkSpec("tcp-100g", 100e9 / 8 * 0.8, 2e-3),
    "shm": LinkSpec("shm", 10 * GB, 0.1e-3),
}


def link_spec(name: str) -> LinkSpec:
    """A preset name, a bandwidth in Gb/s (`--link 200`), or a calibration file's link
    (a hardware preset name falls back to `rdma`)."""
    if name in LINKS:
        return LINKS[name]
    if name in HARDWARE:
        return LINKS["rdma"]
    path = Path(name)
    if path.is_file():
        raw = json.loads(path.read_text()).get("link")
        return LinkSpec(**raw) if raw else LINKS["rdma"]
    try:
        gbps = float(name)
    except ValueError:
        raise ValueError(
            f"unknown link {name!r}: a preset ({', '.join(LINKS)}) or a bandwidth in Gb/s"
        ) from None
    if not gbps > 0:
        raise ValueError(f"link bandwidth must be > 0 Gb/s, got {name}")
    return LinkSpec(f"{gbps:g}gbps", gbps * 1e9 / 8 * 0.8, 2e-3)
