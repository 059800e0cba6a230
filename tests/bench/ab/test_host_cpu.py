"""The host's CPU shares of a group (bench/ab/host_cpu.py) from `/proc/stat` lines, and their
rows in the A/B/A table."""

from __future__ import annotations

from pathlib import Path

import pytest

from relaykv.bench.ab.host_cpu import CpuTimes, cpu_shares, read_cpu_times
from relaykv.bench.ab.report import build_rows


def stat(tmp_path: Path, line: str) -> Path:
    path = tmp_path / "stat"
    path.write_text(line + "\ncpu0 1 2 3 4 5 6 7 8 0 0\n")
    return path


def test_steal_and_busy_shares_between_two_readings(tmp_path: Path) -> None:
    # user nice system idle iowait irq softirq steal guest guest_nice
    before = read_cpu_times(stat(tmp_path, "cpu  100 0 20 300 5 1 4 10 50 0"))
    after = read_cpu_times(stat(tmp_path, "cpu  160 0 30 340 5 1 9 60 80 0"))
    assert before == CpuTimes(total=440, busy=125, steal=10)  # guest is inside user
    shares = cpu_shares(before, after)
    assert shares == pytest.approx({"steal_pct": 50 / 165 * 100, "busy_pct": 75 / 165 * 100})


def test_no_reading_no_shares(tmp_path: Path) -> None:
    assert read_cpu_times(tmp_path / "missing") is None
    assert read_cpu_times(stat(tmp_path, "intr 1 2 3")) is None
    assert read_cpu_times(stat(tmp_path, "cpu 1 x 3")) is None
    old_kernel = read_cpu_times(stat(tmp_path, "cpu 1 2 3 4"))  # no steal field
    assert old_kernel == CpuTimes(total=10, busy=6, steal=0)
    assert cpu_shares(None, old_kernel) is None
    assert cpu_shares(old_kernel, old_kernel) is None  # no time passed


def test_the_table_shows_the_steal_of_each_run() -> None:
    runs = [
        {"label": label, "config": config, "groups": [
            {"group": "c1/output1", "result": {"mean_ttft_ms": ttft}, "host": host}
        ]}
        for label, config, ttft, host in (
            ("A1", "a", 300.0, {"steal_pct": 30.0, "busy_pct": 30.0}),
            ("B1", "b", 470.0, {"steal_pct": 36.0, "busy_pct": 24.0}),
            ("A2", "a", 310.0, {}),  # not read (not Linux): no value, no spread
        )
    ]
    rows = {(r.group, r.metric): r for r in build_rows(runs, "a")}
    steal = rows[("c1/output1", "host_steal_pct")]
    assert steal.name == "Host CPU steal (%)"
    assert steal.values == {"A1": 30.0, "B1": 36.0, "A2": None}
    assert rows[("c1/output1", "host_busy_pct")].values["B1"] == 24.0
